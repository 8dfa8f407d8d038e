use weir_model::harness::run_closed_loop;
use weir_model::{Completion, Component, DeviceIo, IoDir, Link, LinkSpec};

fn io(size: u32, dir: IoDir) -> DeviceIo {
    DeviceIo {
        offset_bytes: 0,
        size_bytes: size,
        dir,
    }
}

#[test]
fn transfer_time_is_latency_plus_bytes_over_bandwidth() {
    let mut link = Link::new(&LinkSpec::fc_8g()).unwrap();
    link.submit(1_000, io(1 << 20, IoDir::Read), 7);
    // 1,048,576 B at 800 MB/s = 1,310,720 ns, plus 10 µs.
    assert_eq!(link.next_event_ns(), Some(1_000 + 1_310_720 + 10_000));
    let mut done = Vec::new();
    link.advance(1_321_719, &mut done);
    assert!(done.is_empty());
    link.advance(1_321_720, &mut done);
    assert_eq!(
        done,
        vec![Completion {
            token: 7,
            at_ns: 1_321_720
        }]
    );
    assert_eq!(link.command_latency_ns(), 10_000);
}

#[test]
fn each_direction_is_a_fifo_and_directions_are_independent() {
    let mut link = Link::new(&LinkSpec {
        bandwidth_mbps: 1000.0,
        latency_us: 0.0,
    })
    .unwrap();
    link.submit(0, io(1_000_000, IoDir::Read), 1);
    link.submit(0, io(1_000_000, IoDir::Read), 2);
    link.submit(0, io(1_000_000, IoDir::Write), 3);
    let mut done = Vec::new();
    link.advance(10_000_000, &mut done);
    let at = |t| {
        done.iter()
            .find(|c: &&Completion| c.token == t)
            .unwrap()
            .at_ns
    };
    assert_eq!(at(1), 1_000_000);
    assert_eq!(at(2), 2_000_000, "second read waits for the first");
    assert_eq!(at(3), 1_000_000, "a write's payload flows the other way");
    assert!(done.windows(2).all(|w| w[0].at_ns <= w[1].at_ns));
}

#[test]
fn link_presets_saturate_at_their_payload_rate() {
    for (name, mbps) in [
        ("fc-4g", 400.0),
        ("fc-8g", 800.0),
        ("10gbe", 1150.0),
        ("1gbe", 115.0),
    ] {
        let mut link = Link::new(&LinkSpec::preset(name).unwrap()).unwrap();
        let r = run_closed_loop(&mut link, 8, 2000, |_| io(256 * 1024, IoDir::Read));
        assert!((r.mbps() / mbps - 1.0).abs() < 0.01, "{name}: {}", r.mbps());
    }
    assert!(LinkSpec::preset("fc-16g").is_err());
    assert!(
        Link::new(&LinkSpec {
            bandwidth_mbps: 0.0,
            latency_us: 1.0
        })
        .is_err()
    );
}
