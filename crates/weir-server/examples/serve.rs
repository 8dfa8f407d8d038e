//! Runs the server until SIGINT/SIGTERM: `cargo run -p weir-server --example serve [config.toml]`
//! (without a file: the embedded demo configuration).

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let config = match std::env::args().nth(1) {
        Some(path) => weir_server::WeirConfig::load(std::path::Path::new(&path))?,
        None => weir_server::WeirConfig::embedded_default(),
    };
    weir_server::serve(config).await
}
