//! No input makes any decoder panic: random bytes (alone, and after a valid
//! prefix) into the server handshake, the request decoder + validation, the
//! client handshake and the client reply decoder.

use proptest::prelude::*;
use weir_nbd::consts::*;
use weir_nbd::{
    BlockSize, ClientConfig, ClientHandshake, ClientSession, ExportDescription, ExportInfo,
    RequestDecoder, RequestHeader, ServerHandshake, validate,
};

fn catalog() -> Vec<ExportDescription> {
    vec![
        ExportDescription::new("a", 1 << 20),
        ExportDescription::new("", 4096),
    ]
}

fn export_info(structured: bool) -> ExportInfo {
    ExportInfo {
        name: "a".into(),
        size_bytes: 1 << 20,
        transmission_flags: ExportDescription::new("a", 1 << 20).transmission_flags(structured),
        structured_replies: structured,
        base_allocation_id: structured.then_some(1),
        block_size: BlockSize {
            min_bytes: 1,
            preferred_bytes: 4096,
            max_payload_bytes: 1 << 16,
        },
        exclusive_lease: None,
    }
}

/// Option frames with plausible headers and random bodies: reach deep states.
fn option_frame() -> impl Strategy<Value = Vec<u8>> {
    (0u32..14, prop::collection::vec(any::<u8>(), 0..64)).prop_map(|(o, body)| {
        let mut v = IHAVEOPT.to_be_bytes().to_vec();
        v.extend_from_slice(&o.to_be_bytes());
        v.extend_from_slice(&(body.len() as u32).to_be_bytes());
        v.extend(body);
        v
    })
}

fn feed_server(bytes: &[u8], split: usize) {
    let mut s = ServerHandshake::new();
    let cat = catalog();
    for piece in bytes.chunks(split.max(1)) {
        match s.input(piece, &cat) {
            Ok(Some(_)) | Err(_) => break,
            Ok(None) => {}
        }
        let _ = s.take_output();
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 512, ..ProptestConfig::default() })]

    #[test]
    fn server_handshake_survives_random_bytes(bytes in prop::collection::vec(any::<u8>(), 0..512), split in 1usize..64) {
        feed_server(&bytes, split);
        let mut prefixed = 3u32.to_be_bytes().to_vec();
        prefixed.extend(&bytes);
        feed_server(&prefixed, split);
    }

    #[test]
    fn server_handshake_survives_random_options(frames in prop::collection::vec(option_frame(), 0..12), split in 1usize..64) {
        let mut bytes = 1u32.to_be_bytes().to_vec();
        for f in frames {
            bytes.extend(f);
        }
        feed_server(&bytes, split);
    }

    #[test]
    fn request_decoder_and_validate_survive_random_bytes(
        bytes in prop::collection::vec(any::<u8>(), 0..1024),
        split in 1usize..64,
        structured in any::<bool>(),
    ) {
        let info = export_info(structured);
        let mut d = RequestDecoder::new(info.block_size.max_payload_bytes);
        for piece in bytes.chunks(split) {
            d.feed(piece);
            while let Ok(Some(r)) = d.next_request() {
                let _ = validate(&r, &info);
            }
        }
    }

    #[test]
    fn random_headers_validate_without_panic(
        flags in any::<u16>(), command in 0u16..12, offset in any::<u64>(), length in any::<u32>(), structured in any::<bool>()
    ) {
        let info = export_info(structured);
        let header = RequestHeader { flags, command, handle: 1, offset, length };
        prop_assert_eq!(RequestHeader::decode(&header.encode()).unwrap(), header);
        let payload = (command == CMD_WRITE && length <= 1 << 16).then(|| vec![0; length as usize]);
        if let Ok(v) = validate(&weir_nbd::Request { header, payload }, &info) {
            // Whatever passes is inside the export.
            if !matches!(v.command, weir_nbd::Command::Flush | weir_nbd::Command::Disconnect) {
                prop_assert!(offset.checked_add(length as u64).is_some_and(|e| e <= info.size_bytes));
            }
        }
    }

    #[test]
    fn client_handshake_survives_random_bytes(bytes in prop::collection::vec(any::<u8>(), 0..512), split in 1usize..64) {
        let mut greeting = NBDMAGIC.to_be_bytes().to_vec();
        greeting.extend(IHAVEOPT.to_be_bytes());
        greeting.extend(3u16.to_be_bytes());
        for input in [bytes.clone(), [greeting, bytes].concat()] {
            let mut c = ClientHandshake::new(ClientConfig::go("a"));
            for piece in input.chunks(split) {
                if !matches!(c.input(piece), Ok(None)) { break; }
            }
        }
    }

    #[test]
    fn client_session_survives_random_replies(
        bytes in prop::collection::vec(any::<u8>(), 0..1024),
        split in 1usize..64,
        structured in any::<bool>(),
    ) {
        let mut s = ClientSession::new(export_info(structured));
        s.read(0, 16);
        s.read(100, 0);
        s.block_status(0, 4096, false);
        s.write(0, b"abc", false);
        // Pending handles are 1..=4; make the random bytes hit them sometimes.
        let mut input = bytes.clone();
        if input.len() >= 16 {
            let magic = if structured { STRUCTURED_REPLY_MAGIC } else { SIMPLE_REPLY_MAGIC };
            input[..4].copy_from_slice(&magic.to_be_bytes());
            input[8..16].copy_from_slice(&(1 + bytes[0] as u64 % 4).to_be_bytes());
        }
        for piece in input.chunks(split) {
            if s.input(piece).is_err() { break; }
        }
        while s.poll_completion().is_some() {}
    }
}
