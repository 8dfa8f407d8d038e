//! Whatever the configuration and requests, an array completes every request exactly
//! once, in time order, never before it was submitted, and never panics.

use proptest::prelude::*;
use weir_model::{
    Array, ArraySpec, BatteryState, Component, ControllerRef, ControllerSpec, DeviceIo, DriveRef,
    IoDir, IoPolicy, PolicyOverride, RaidSpec, ReadPolicy, WritePolicy,
};

fn any_spec() -> impl Strategy<Value = ArraySpec> {
    (
        prop_oneof![
            Just((0u32, 3u32, 1u32)),
            Just((1, 2, 1)),
            Just((5, 4, 1)),
            Just((6, 5, 1)),
            Just((10, 4, 1)),
            Just((50, 6, 2)),
            Just((60, 8, 2))
        ],
        prop_oneof![
            Just("sas-15k"),
            Just("sata-7200"),
            Just("sata-ssd"),
            Just("pcie-flash")
        ],
        prop_oneof![
            Just(WritePolicy::WriteBack),
            Just(WritePolicy::WriteThrough),
            Just(WritePolicy::AlwaysWriteBack)
        ],
        prop_oneof![
            Just(ReadPolicy::NoReadAhead),
            Just(ReadPolicy::ReadAhead),
            Just(ReadPolicy::Adaptive)
        ],
        any::<bool>(),
        any::<bool>(),
        prop_oneof![Just(1u32), Just(16), Just(1024)],
        prop_oneof![Just(4096u32), Just(65536), Just(1 << 20)],
    )
        .prop_map(
            |((level, drives, spans), drive, wp, rp, cached, disk_cache, cache_mib, element)| {
                let mut c = ControllerSpec::pcie_gen2();
                c.cache_mib = cache_mib;
                c.read_ahead_bytes = 256 << 10;
                ArraySpec {
                    controller: ControllerRef::Custom(c),
                    raid: RaidSpec {
                        level,
                        drives,
                        stripe_element_bytes: element,
                        spans,
                    },
                    drive: DriveRef::Preset(drive.into()),
                    policy: PolicyOverride {
                        write_policy: Some(wp),
                        read_policy: Some(rp),
                        io_policy: Some(if cached {
                            IoPolicy::Cached
                        } else {
                            IoPolicy::Direct
                        }),
                        battery: Some(BatteryState::Good),
                        disk_cache: Some(disk_cache),
                    },
                    clone_cache: None,
                }
            },
        )
}

fn any_request() -> impl Strategy<Value = (u64, DeviceIo)> {
    (
        0u64..2_000_000,
        prop_oneof![0u64..(1 << 22), any::<u64>()],
        prop_oneof![Just(0u32), 1u32..70_000, Just(1 << 20), Just(3 << 20)],
        any::<bool>(),
        any::<bool>(),
    )
        .prop_map(|(gap_ns, offset, size, read, sequential)| {
            let offset = if sequential { offset & !0xffff } else { offset };
            (
                gap_ns,
                DeviceIo {
                    offset_bytes: offset,
                    size_bytes: size,
                    dir: if read { IoDir::Read } else { IoDir::Write },
                },
            )
        })
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(48))]

    #[test]
    fn every_request_completes_once_in_order(spec in any_spec(), reqs in prop::collection::vec(any_request(), 1..120)) {
        let mut a = Array::new(&spec, 9).unwrap();
        let mut done = Vec::new();
        let mut submitted = Vec::new();
        let mut now = 0u64;
        for (i, (gap, io)) in reqs.iter().enumerate() {
            let target = now + gap;
            while let Some(t) = a.next_event_ns() {
                if t > target {
                    break;
                }
                a.advance(t, &mut done);
            }
            now = target;
            a.submit(now, *io, i as u64);
            submitted.push(now);
        }
        let mut guard = 0;
        while let Some(t) = a.next_event_ns() {
            a.advance(t, &mut done);
            guard += 1;
            prop_assert!(guard < 10_000_000, "no progress");
        }
        prop_assert_eq!(done.len(), reqs.len());
        prop_assert_eq!(a.host_in_flight(), 0);
        prop_assert_eq!(a.dirty_bytes(), 0);
        let mut seen = vec![false; reqs.len()];
        for w in done.windows(2) {
            prop_assert!(w[0].at_ns <= w[1].at_ns);
        }
        for c in &done {
            let i = c.token as usize;
            prop_assert!(!seen[i], "token {} completed twice", i);
            seen[i] = true;
            prop_assert!(c.at_ns >= submitted[i]);
        }
    }
}
