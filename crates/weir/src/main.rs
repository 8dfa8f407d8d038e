fn main() {
    println!("weir: under construction");
}
