//! Cost of the protocol work per request, without I/O: decode a header,
//! validate it, encode the reply header; and the client decoding a structured
//! 4 KiB read reply. `cargo bench -p weir-nbd`.

use criterion::{Criterion, Throughput, criterion_group, criterion_main};
use std::hint::black_box;
use weir_nbd::consts::CMD_READ;
use weir_nbd::{
    ClientSession, ExportDescription, ExportInfo, Request, RequestHeader, reply, validate,
};

fn export() -> ExportInfo {
    let d = ExportDescription::new("v", 1 << 30);
    ExportInfo {
        name: "v".into(),
        size_bytes: d.size_bytes,
        transmission_flags: d.transmission_flags(true),
        structured_replies: true,
        base_allocation_id: Some(1),
        block_size: d.block_size,
        exclusive_lease: None,
    }
}

fn server_path(c: &mut Criterion) {
    let info = export();
    let wire = RequestHeader {
        flags: 0,
        command: CMD_READ,
        handle: 7,
        offset: 1 << 20,
        length: 4096,
    }
    .encode();
    let mut g = c.benchmark_group("server");
    g.throughput(Throughput::Elements(1));
    g.bench_function("decode_validate_reply_header", |b| {
        let mut out = Vec::with_capacity(64);
        b.iter(|| {
            let header = RequestHeader::decode(black_box(&wire)).unwrap();
            let v = validate(
                &Request {
                    header,
                    payload: None,
                },
                &info,
            )
            .unwrap();
            out.clear();
            reply::read_reply_header(&mut out, &info, v.handle, header.offset, header.length);
            black_box(&out);
        })
    });
    g.finish();
}

fn client_path(c: &mut Criterion) {
    let info = export();
    let data = vec![0xabu8; 4096];
    let mut g = c.benchmark_group("client");
    g.throughput(Throughput::Bytes(4096));
    g.bench_function("send_read_and_decode_4k_structured_reply", |b| {
        let mut s = ClientSession::new(info.clone());
        let mut reply_bytes = Vec::with_capacity(8192);
        b.iter(|| {
            let h = s.read(0, 4096);
            s.take_output();
            reply_bytes.clear();
            reply::read_reply(&mut reply_bytes, &info, h, 0, &data);
            s.input(&reply_bytes).unwrap();
            black_box(s.poll_completion().unwrap());
        })
    });
    g.finish();
}

criterion_group!(benches, server_path, client_path);
criterion_main!(benches);
