//! Prints simulated I/Os per wall-clock second for the array and link models.
//! Run: `cargo bench -p weir-model --bench array_throughput`

/// CPU time of this thread (immune to other processes sharing the machine), s.
fn cpu_s() -> f64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: clock_gettime writes into the provided timespec.
    unsafe { libc::clock_gettime(libc::CLOCK_THREAD_CPUTIME_ID, &mut ts) };
    ts.tv_sec as f64 + ts.tv_nsec as f64 * 1e-9
}

use weir_model::harness::{SplitMix64, run_closed_loop};
use weir_model::{Array, Component, DeviceIo, IoDir, Link, LinkSpec};

fn oltp(preset: &str, qd: u32, n: u64) {
    let mut a = Array::from_preset(preset, 1).expect("preset");
    let mut rng = SplitMix64(1);
    let blocks = a.capacity_bytes() * 7 / 10 / 8192;
    let t0 = cpu_s();
    let r = run_closed_loop(&mut a, qd, n, |_| DeviceIo {
        offset_bytes: rng.below(blocks) * 8192,
        size_bytes: 8192,
        dir: if rng.below(10) < 7 {
            IoDir::Read
        } else {
            IoDir::Write
        },
    });
    let wall = cpu_s() - t0;
    println!(
        "{preset:>18} OLTP 70/30 8K QD{qd}: {:>8.0} simulated IOPS, mean {:>6.2} ms | {:>9.0} host I/Os per CPU s ({:.0} ns each)",
        r.iops(),
        r.mean_latency_ns / 1e6,
        n as f64 / wall,
        wall * 1e9 / n as f64
    );
}

fn sequential(preset: &str, size: u32, dir: IoDir, qd: u32, n: u64) {
    let mut a = Array::from_preset(preset, 1).expect("preset");
    let t0 = cpu_s();
    let r = run_closed_loop(&mut a, qd, n, |i| DeviceIo {
        offset_bytes: i * size as u64,
        size_bytes: size,
        dir,
    });
    let wall = cpu_s() - t0;
    println!(
        "{preset:>18} seq {dir:?} {}K QD{qd}: {:>8.0} MB/s | {:>9.0} host I/Os per CPU s",
        size / 1024,
        r.mbps(),
        n as f64 / wall
    );
}

/// Figures to compare with the seeds (printed, never asserted or tuned).
fn fidelity() {
    use weir_model::{ArraySpec, RaidSpec};
    print!("RAID 0 seq read 1 MiB QD32 by drive count (MB/s):");
    for drives in [4, 8, 12, 16, 18, 20, 24] {
        let mut spec = ArraySpec::preset("15k-sas-raid0x24").expect("preset");
        spec.raid = RaidSpec::new(0, drives, 64 << 10);
        let mut a = Array::new(&spec, 1).expect("array");
        let r = run_closed_loop(&mut a, 32, 4000, |i| DeviceIo {
            offset_bytes: i << 20,
            size_bytes: 1 << 20,
            dir: IoDir::Read,
        });
        print!(" {drives}:{:.0}", r.mbps());
    }
    println!();
    for preset in ["15k-sas-raid0x24", "15k-sas-raid10x24"] {
        let mut a = Array::from_preset(preset, 1).expect("preset");
        let r = run_closed_loop(&mut a, 32, 6000, |i| DeviceIo {
            offset_bytes: i * (512 << 10),
            size_bytes: 512 << 10,
            dir: IoDir::Write,
        });
        println!("{preset} seq write 512K QD32: {:.0} MB/s", r.mbps());
    }
    // Steady state: 1M I/Os, IOPS over the second half (the 768 MB of write-back space
    // fills after ≈ 330k I/Os of this mix).
    print!(
        "15k-sas-raid5x24 OLTP 70/30 8K steady state by outstanding I/Os (IOPS, mean ms over the run):"
    );
    for qd in [16, 48, 128] {
        let mut a = Array::from_preset("15k-sas-raid5x24", 1).expect("preset");
        let mut rng = SplitMix64(2);
        let blocks = a.capacity_bytes() * 7 / 10 / 8192;
        let r = run_closed_loop(&mut a, qd, 1_000_000, |_| DeviceIo {
            offset_bytes: rng.below(blocks) * 8192,
            size_bytes: 8192,
            dir: if rng.below(10) < 7 {
                IoDir::Read
            } else {
                IoDir::Write
            },
        });
        print!(
            " QD{qd}: {:.0} ({:.1} ms, stalls {})",
            r.steady_iops(0.5),
            r.mean_latency_ns / 1e6,
            a.stats().write_stalls
        );
    }
    println!();
}

fn main() {
    fidelity();
    oltp("15k-sas-raid5x24", 48, 400_000);
    oltp("15k-sas-raid0x24", 48, 400_000);
    oltp("15k-sas-raid10x24", 48, 400_000);
    oltp("ssd-raid5x8", 48, 400_000);
    sequential("15k-sas-raid0x24", 1 << 20, IoDir::Read, 32, 100_000);
    sequential("15k-sas-raid10x24", 512 << 10, IoDir::Write, 32, 100_000);
    sequential("15k-sas-raid5x24", 64 << 10, IoDir::Write, 32, 200_000);

    let mut link = Link::new(&LinkSpec::fc_8g()).expect("link");
    let n = 2_000_000u64;
    let t0 = cpu_s();
    let mut done = Vec::with_capacity(64);
    let mut t = 0;
    for i in 0..n {
        link.submit(
            t,
            DeviceIo {
                offset_bytes: 0,
                size_bytes: 8192,
                dir: IoDir::Read,
            },
            i,
        );
        t += 5_000;
        done.clear();
        link.advance(t, &mut done);
    }
    let wall = cpu_s() - t0;
    println!(
        "link fc-8g: {:.0} transfers per CPU s ({:.0} ns each)",
        n as f64 / wall,
        wall * 1e9 / n as f64
    );
}
