//! Transmission phase: validation table, and a client session talking to an
//! in-memory server built from the decoder, `validate` and the reply encoders,
//! replying out of order.

use weir_nbd::consts::*;
use weir_nbd::reply;
use weir_nbd::{
    BlockSize, ClientSession, Command, ErrorCode, ExportInfo, Extent, ReplyData, Request,
    RequestDecoder, RequestHeader, validate,
};

fn info(structured: bool, read_only: bool) -> ExportInfo {
    let mut flags = FLAG_HAS_FLAGS
        | FLAG_SEND_FLUSH
        | FLAG_SEND_FUA
        | FLAG_SEND_TRIM
        | FLAG_SEND_WRITE_ZEROES
        | FLAG_SEND_FAST_ZERO
        | FLAG_SEND_CACHE;
    if structured {
        flags |= FLAG_SEND_DF;
    }
    if read_only {
        flags |= FLAG_READ_ONLY;
    }
    ExportInfo {
        name: "v".into(),
        size_bytes: 1 << 20,
        transmission_flags: flags,
        structured_replies: structured,
        base_allocation_id: structured.then_some(7),
        block_size: BlockSize {
            min_bytes: 1,
            preferred_bytes: 4096,
            max_payload_bytes: 1 << 16,
        },
        exclusive_lease: None,
    }
}

fn req(command: u16, flags: u16, offset: u64, length: u32) -> Request {
    let payload = (command == CMD_WRITE && length <= 1 << 16).then(|| vec![0u8; length as usize]);
    Request {
        header: RequestHeader {
            flags,
            command,
            handle: 9,
            offset,
            length,
        },
        payload,
    }
}

fn code(r: &Request, e: &ExportInfo) -> Option<ErrorCode> {
    validate(r, e).err().map(|e| e.code)
}

#[test]
fn validation_table() {
    let rw = info(true, false);
    let simple = info(false, false);
    let ro = info(true, true);
    let size = rw.size_bytes;
    use ErrorCode::*;
    let cases: Vec<(&str, Request, &ExportInfo, Option<ErrorCode>)> = vec![
        ("read ok", req(CMD_READ, 0, 0, 4096), &rw, None),
        (
            "read to the end",
            req(CMD_READ, 0, size - 4096, 4096),
            &rw,
            None,
        ),
        (
            "read past end",
            req(CMD_READ, 0, size - 4096, 4097),
            &rw,
            Some(Inval),
        ),
        (
            "read offset overflow",
            req(CMD_READ, 0, u64::MAX - 10, 100),
            &rw,
            Some(Inval),
        ),
        (
            "read over max payload",
            req(CMD_READ, 0, 0, (1 << 16) + 1),
            &rw,
            Some(Inval),
        ),
        (
            "read with DF, structured",
            req(CMD_READ, CMD_FLAG_DF, 0, 512),
            &rw,
            None,
        ),
        (
            "read with DF, not negotiated",
            req(CMD_READ, CMD_FLAG_DF, 0, 512),
            &simple,
            Some(Inval),
        ),
        (
            "read with FUA (accepted)",
            req(CMD_READ, CMD_FLAG_FUA, 0, 512),
            &rw,
            None,
        ),
        (
            "read with NO_HOLE",
            req(CMD_READ, CMD_FLAG_NO_HOLE, 0, 512),
            &rw,
            Some(Inval),
        ),
        (
            "unknown flag",
            req(CMD_READ, 1 << 12, 0, 512),
            &rw,
            Some(Inval),
        ),
        (
            "payload-len flag without extended headers",
            req(CMD_WRITE, CMD_FLAG_PAYLOAD_LEN, 0, 512),
            &rw,
            Some(Inval),
        ),
        (
            "write ok with FUA",
            req(CMD_WRITE, CMD_FLAG_FUA, 0, 512),
            &rw,
            None,
        ),
        (
            "write past end",
            req(CMD_WRITE, 0, size, 1),
            &rw,
            Some(NoSpc),
        ),
        (
            "write on read-only",
            req(CMD_WRITE, 0, 0, 512),
            &ro,
            Some(Perm),
        ),
        (
            "write over max payload (discarded)",
            req(CMD_WRITE, 0, 0, (1 << 16) + 1),
            &rw,
            Some(Inval),
        ),
        (
            "trim on read-only",
            req(CMD_TRIM, 0, 0, 512),
            &ro,
            Some(Perm),
        ),
        ("trim past end", req(CMD_TRIM, 0, size, 1), &rw, Some(Inval)),
        (
            "trim larger than max payload is fine",
            req(CMD_TRIM, 0, 0, 1 << 20),
            &rw,
            None,
        ),
        (
            "write zeroes past end",
            req(CMD_WRITE_ZEROES, 0, size - 1, 2),
            &rw,
            Some(NoSpc),
        ),
        (
            "write zeroes on read-only",
            req(CMD_WRITE_ZEROES, 0, 0, 2),
            &ro,
            Some(Perm),
        ),
        (
            "write zeroes no-hole fast-zero",
            req(
                CMD_WRITE_ZEROES,
                CMD_FLAG_NO_HOLE | CMD_FLAG_FAST_ZERO,
                0,
                8,
            ),
            &rw,
            None,
        ),
        (
            "write zeroes with DF",
            req(CMD_WRITE_ZEROES, CMD_FLAG_DF, 0, 8),
            &rw,
            Some(Inval),
        ),
        ("flush ok", req(CMD_FLUSH, 0, 0, 0), &rw, None),
        (
            "flush with range",
            req(CMD_FLUSH, 0, 0, 1),
            &rw,
            Some(Inval),
        ),
        (
            "flush on read-only is fine",
            req(CMD_FLUSH, 0, 0, 0),
            &ro,
            None,
        ),
        ("cache ok", req(CMD_CACHE, 0, 0, 4096), &ro, None),
        (
            "cache past end",
            req(CMD_CACHE, 0, size, 1),
            &rw,
            Some(Inval),
        ),
        (
            "block status ok",
            req(CMD_BLOCK_STATUS, CMD_FLAG_REQ_ONE, 0, 4096),
            &rw,
            None,
        ),
        (
            "block status without contexts",
            req(CMD_BLOCK_STATUS, 0, 0, 4096),
            &simple,
            Some(Inval),
        ),
        (
            "block status past end",
            req(CMD_BLOCK_STATUS, 0, size, 1),
            &rw,
            Some(Inval),
        ),
        (
            "block status length 0",
            req(CMD_BLOCK_STATUS, 0, 0, 0),
            &rw,
            Some(Inval),
        ),
        (
            "req_one on read",
            req(CMD_READ, CMD_FLAG_REQ_ONE, 0, 1),
            &rw,
            Some(Inval),
        ),
        ("unknown command", req(8, 0, 0, 0), &rw, Some(Inval)),
        (
            "unknown command 0xffff",
            req(0xffff, 0, 0, 0),
            &rw,
            Some(Inval),
        ),
        ("disconnect", req(CMD_DISC, 0, 0, 0), &ro, None),
    ];
    for (name, r, e, expected) in cases {
        assert_eq!(code(&r, e), expected, "{name}");
    }
    let mut aligned = info(true, false);
    aligned.block_size.min_bytes = 512;
    assert_eq!(code(&req(CMD_READ, 0, 256, 512), &aligned), Some(Inval));
    assert_eq!(code(&req(CMD_READ, 0, 512, 512), &aligned), None);
    let mut no_fua = info(true, false);
    no_fua.transmission_flags &= !FLAG_SEND_FUA;
    assert_eq!(
        code(&req(CMD_WRITE, CMD_FLAG_FUA, 0, 1), &no_fua),
        Some(Inval)
    );
    // Only the lease context selected: BLOCK_STATUS is valid (its chunk alone).
    let mut lease_only = info(true, false);
    lease_only.base_allocation_id = None;
    assert_eq!(
        code(&req(CMD_BLOCK_STATUS, 0, 0, 10), &lease_only),
        Some(Inval)
    );
    lease_only.exclusive_lease = Some("t".into());
    let v = validate(&req(CMD_BLOCK_STATUS, 0, 0, 10), &lease_only).unwrap();
    assert!(matches!(
        v.command,
        Command::BlockStatus {
            context_id: None,
            ..
        }
    ));
    let v = validate(&req(CMD_BLOCK_STATUS, CMD_FLAG_REQ_ONE, 0, 10), &rw).unwrap();
    assert_eq!(
        v.command,
        Command::BlockStatus {
            offset: 0,
            length: 10,
            req_one: true,
            context_id: Some(7)
        }
    );
}

/// In-memory server: a RAM disk with a map of written regions for block status.
struct MemServer {
    export: ExportInfo,
    disk: Vec<u8>,
    allocated: Vec<bool>, // per 4 KiB block
    decoder: RequestDecoder,
}

impl MemServer {
    fn new(export: ExportInfo) -> MemServer {
        let size = export.size_bytes as usize;
        let decoder = RequestDecoder::new(export.block_size.max_payload_bytes);
        MemServer {
            export,
            disk: vec![0; size],
            allocated: vec![false; size / 4096],
            decoder,
        }
    }

    /// Handles everything received; replies in reverse order of arrival.
    fn serve(&mut self, bytes: &[u8]) -> (Vec<u8>, bool) {
        self.decoder.feed(bytes);
        let mut replies: Vec<Vec<u8>> = vec![];
        let mut disconnect = false;
        while let Some(r) = self.decoder.next_request().expect("valid stream") {
            let mut out = vec![];
            match validate(&r, &self.export) {
                Err(e) => reply::error_reply(&mut out, &self.export, r.header.handle, &e),
                Ok(v) => match v.command {
                    Command::Read { offset, length, .. } => {
                        let o = offset as usize;
                        reply::read_reply(
                            &mut out,
                            &self.export,
                            v.handle,
                            offset,
                            &self.disk[o..o + length as usize],
                        );
                    }
                    Command::Write { offset, .. } => {
                        let data = r.payload.unwrap();
                        let o = offset as usize;
                        self.disk[o..o + data.len()].copy_from_slice(&data);
                        for b in o / 4096..(o + data.len()).div_ceil(4096) {
                            self.allocated[b] = true;
                        }
                        reply::ok_reply(&mut out, v.handle);
                    }
                    Command::BlockStatus {
                        offset,
                        length,
                        req_one,
                        context_id,
                    } => {
                        let extents: Vec<Extent> = (offset as usize / 4096..self.allocated.len())
                            .map(|b| Extent {
                                length: 4096
                                    - if b == offset as usize / 4096 {
                                        offset as u32 % 4096
                                    } else {
                                        0
                                    },
                                flags: if self.allocated[b] {
                                    0
                                } else {
                                    STATE_HOLE | STATE_ZERO
                                },
                            })
                            .collect();
                        let context_id = context_id.expect("base:allocation selected");
                        reply::block_status_chunk(
                            &mut out, v.handle, context_id, &extents, req_one, length, false,
                        );
                        reply::none_chunk(&mut out, v.handle);
                    }
                    Command::Disconnect => disconnect = true,
                    _ => reply::ok_reply(&mut out, v.handle),
                },
            }
            replies.push(out);
        }
        replies.reverse();
        (replies.concat(), disconnect)
    }
}

fn run(client: &mut ClientSession, server: &mut MemServer) -> Vec<weir_nbd::Completion> {
    let (bytes, _) = server.serve(&client.take_output());
    // Feed in odd-sized pieces to exercise partial replies.
    for piece in bytes.chunks(7) {
        client.input(piece).unwrap();
    }
    let mut done = vec![];
    while let Some(c) = client.poll_completion() {
        done.push(c);
    }
    done
}

#[test]
fn data_round_trips_with_out_of_order_replies() {
    for structured in [false, true] {
        let export = info(structured, false);
        let mut server = MemServer::new(export.clone());
        let mut client = ClientSession::new(export);
        let pattern: Vec<u8> = (0..65536u32).map(|i| (i * 7 + 3) as u8).collect();
        let w1 = client.write(0, &pattern, false);
        let w2 = client.write(1 << 19, &pattern[..4096], true);
        let done = run(&mut client, &mut server);
        assert_eq!(done.len(), 2);
        assert_eq!(done[0].handle, w2, "replies came back in reverse order");
        assert_eq!(done[1].handle, w1);
        assert!(done.iter().all(|c| c.result == Ok(ReplyData::None)));
        let r1 = client.read(0, 65536);
        let r2 = client.read((1 << 19) + 100, 10);
        let r3 = client.read(100, 0);
        let f = client.flush();
        assert_eq!(client.in_flight(), 4);
        let done = run(&mut client, &mut server);
        assert_eq!(client.in_flight(), 0);
        let by_handle = |h| done.iter().find(|c| c.handle == h).unwrap().result.clone();
        assert_eq!(by_handle(r1), Ok(ReplyData::Read(pattern.clone())));
        assert_eq!(
            by_handle(r2),
            Ok(ReplyData::Read(pattern[100..110].to_vec()))
        );
        assert_eq!(by_handle(r3), Ok(ReplyData::Read(vec![])));
        assert_eq!(by_handle(f), Ok(ReplyData::None));
    }
}

#[test]
fn errors_come_back_with_codes_and_messages() {
    for structured in [false, true] {
        let export = info(structured, false);
        let mut server = MemServer::new(export.clone());
        let mut client = ClientSession::new(export.clone());
        let past_end = client.read(export.size_bytes, 1);
        let big = client.write(0, &vec![1u8; (1 << 16) + 1], false);
        let bad_flag = client.send_raw(CMD_READ, 1 << 9, 0, 1, &[]);
        let then_ok = client.read(0, 1);
        let done = run(&mut client, &mut server);
        let by_handle = |h| done.iter().find(|c| c.handle == h).unwrap().result.clone();
        let e = by_handle(past_end).unwrap_err();
        assert_eq!(e.code, ErrorCode::Inval);
        if structured {
            assert!(e.message.contains("exceeds the export size"), "{e}");
        }
        assert_eq!(by_handle(big).unwrap_err().code, ErrorCode::Inval);
        assert_eq!(by_handle(bad_flag).unwrap_err().code, ErrorCode::Inval);
        assert_eq!(
            by_handle(then_ok),
            Ok(ReplyData::Read(vec![0])),
            "the oversized payload was skipped cleanly"
        );
    }
    let ro = info(false, true);
    let mut server = MemServer::new(ro.clone());
    let mut client = ClientSession::new(ro);
    let w = client.write(0, b"x", false);
    let done = run(&mut client, &mut server);
    assert_eq!(done[0].handle, w);
    assert_eq!(done[0].result.clone().unwrap_err().code, ErrorCode::Perm);
}

#[test]
fn block_status_reports_holes_and_data() {
    let export = info(true, false);
    let mut server = MemServer::new(export.clone());
    let mut client = ClientSession::new(export);
    client.write(8192, &[5u8; 4096], false);
    run(&mut client, &mut server);
    let all = client.block_status(0, 16384, false);
    let one = client.block_status(8192, 16384, true);
    let partial = client.block_status(100, 50, false);
    let done = run(&mut client, &mut server);
    let by_handle = |h| done.iter().find(|c| c.handle == h).unwrap().result.clone();
    let hz = STATE_HOLE | STATE_ZERO;
    let ext = |v: &[(u32, u32)]| {
        v.iter()
            .map(|&(length, flags)| Extent { length, flags })
            .collect::<Vec<_>>()
    };
    assert_eq!(
        by_handle(all),
        Ok(ReplyData::BlockStatus(vec![(
            7,
            ext(&[(4096, hz), (4096, hz), (4096, 0), (4096, hz)])
        )]))
    );
    assert_eq!(
        by_handle(one),
        Ok(ReplyData::BlockStatus(vec![(7, ext(&[(4096, 0)]))]))
    );
    assert_eq!(
        by_handle(partial),
        Ok(ReplyData::BlockStatus(vec![(7, ext(&[(50, hz)]))]))
    );
}

#[test]
fn structured_read_reassembles_data_and_hole_chunks() {
    let export = info(true, false);
    let mut client = ClientSession::new(export);
    let h = client.read(1000, 30);
    let mut out = vec![];
    reply::offset_data_header(&mut out, h, 1020, 10, false);
    out.extend_from_slice(&[9u8; 10]);
    reply::offset_hole(&mut out, h, 1010, 10, false);
    reply::offset_data_header(&mut out, h, 1000, 10, false);
    out.extend_from_slice(&[1u8; 10]);
    reply::none_chunk(&mut out, h);
    client.input(&out).unwrap();
    let mut expected = vec![1u8; 10];
    expected.extend([0u8; 10]);
    expected.extend([9u8; 10]);
    assert_eq!(
        client.poll_completion().unwrap().result,
        Ok(ReplyData::Read(expected))
    );
}

#[test]
fn client_rejects_inconsistent_replies() {
    let export = info(true, false);
    // Data outside the request.
    let mut client = ClientSession::new(export.clone());
    let h = client.read(0, 10);
    let mut out = vec![];
    reply::offset_data_header(&mut out, h, 5, 10, true);
    out.extend_from_slice(&[0u8; 10]);
    assert!(client.input(&out).is_err());
    // Not enough data before DONE.
    let mut client = ClientSession::new(export.clone());
    let h = client.read(0, 10);
    let mut out = vec![];
    reply::offset_data_header(&mut out, h, 0, 5, true);
    out.extend_from_slice(&[0u8; 5]);
    assert!(client.input(&out).is_err());
    // Overlapping chunks whose lengths add up to the request's: a gap of zeros
    // passed as a successful read until session 29 (the spec forbids overlap).
    for (first, second) in [((0, 5), (0, 5)), ((0, 6), (4, 4)), ((4, 6), (0, 6))] {
        let mut client = ClientSession::new(export.clone());
        let h = client.read(0, 10);
        let mut out = vec![];
        reply::offset_data_header(&mut out, h, first.0, first.1, false);
        out.extend(std::iter::repeat_n(7u8, first.1 as usize));
        reply::offset_hole(&mut out, h, second.0, second.1, true);
        let e = client.input(&out).unwrap_err();
        assert!(
            e.to_string().contains("overlap"),
            "{first:?} {second:?}: {e}"
        );
    }
    // Adjacent chunks in any order are fine.
    let mut client = ClientSession::new(export.clone());
    let h = client.read(0, 10);
    let mut out = vec![];
    reply::offset_hole(&mut out, h, 5, 5, false);
    reply::offset_data_header(&mut out, h, 0, 5, true);
    out.extend_from_slice(&[3u8; 5]);
    client.input(&out).unwrap();
    let mut expected = vec![3u8; 5];
    expected.extend([0u8; 5]);
    assert_eq!(
        client.poll_completion().unwrap().result,
        Ok(ReplyData::Read(expected))
    );
    // Unknown handle.
    let mut client = ClientSession::new(export);
    let mut out = vec![];
    reply::simple_reply(&mut out, 42, 0);
    assert!(client.input(&out).is_err());
}

#[test]
fn error_chunk_message_is_clipped_to_the_string_limit() {
    let mut out = vec![];
    let long = "é".repeat(3000); // 6000 bytes
    reply::error_chunk(
        &mut out,
        1,
        &weir_nbd::NbdError::new(ErrorCode::Io, long),
        true,
    );
    let msg_len = u16::from_be_bytes([out[24], out[25]]) as usize;
    assert!(msg_len <= MAX_STRING_LEN);
    assert!(std::str::from_utf8(&out[26..26 + msg_len]).is_ok());
    assert_eq!(
        u32::from_be_bytes(out[16..20].try_into().unwrap()) as usize,
        6 + msg_len
    );
}

#[test]
fn decoder_rejects_bad_magic_and_stays_failed() {
    let mut d = RequestDecoder::new(1024);
    let mut h = RequestHeader {
        flags: 0,
        command: CMD_READ,
        handle: 1,
        offset: 0,
        length: 1,
    }
    .encode();
    h[0] = 0;
    d.feed(&h);
    assert!(d.next_request().is_err());
    assert!(d.next_request().is_err());
}

#[test]
fn error_offset_and_unknown_error_chunks_fail_the_request() {
    let export = info(true, false);
    let mut client = ClientSession::new(export);
    let a = client.read(0, 8192);
    let b = client.write(0, b"x", false);
    let mut out = vec![];
    reply::offset_data_header(&mut out, a, 0, 4096, false);
    out.extend_from_slice(&[1u8; 4096]);
    let e = weir_nbd::NbdError::new(ErrorCode::Io, "media error");
    reply::error_offset_chunk(&mut out, a, &e, 4096, false);
    reply::none_chunk(&mut out, a);
    // An error chunk of a type this client does not know (bit 15 set) still errors.
    reply::chunk_header(
        &mut out,
        REPLY_FLAG_DONE,
        REPLY_TYPE_ERROR_BIT | 77,
        b,
        6 + 3,
    );
    out.extend_from_slice(&28u32.to_be_bytes());
    out.extend_from_slice(&3u16.to_be_bytes());
    out.extend_from_slice(b"ful");
    client.input(&out).unwrap();
    let ca = client.poll_completion().unwrap();
    assert_eq!(ca.handle, a);
    assert_eq!(ca.result, Err(e));
    let cb = client.poll_completion().unwrap();
    assert_eq!(cb.handle, b);
    assert_eq!(cb.result.unwrap_err().code, ErrorCode::NoSpc);
}
