//! Client and server handshake state machines talking to each other, and the
//! server's answers to malformed or unusual option streams.

use weir_nbd::consts::*;
use weir_nbd::{
    ClientConfig, ClientGoal, ClientHandshake, ClientOutcome, ExportDescription, ExportInfo,
    HandshakeEvent, ProtocolError, ServerHandshake,
};

fn catalog() -> Vec<ExportDescription> {
    let mut a = ExportDescription::new("vol-a", 1 << 20);
    a.description = "first volume".into();
    a.can_multi_conn = true;
    let mut b = ExportDescription::new("vol-b", 4096);
    b.read_only = true;
    vec![a, b]
}

/// `bytes` as one piece, or one byte at a time when `trickle`.
fn pieces(bytes: &[u8], trickle: bool) -> Vec<&[u8]> {
    if trickle {
        bytes.chunks(1).collect()
    } else {
        vec![bytes]
    }
}

/// Runs both state machines to completion, feeding bytes one at a time when
/// `trickle` (exercises partial input everywhere).
fn pump(
    config: ClientConfig,
    exports: &dyn weir_nbd::ExportCatalog,
    trickle: bool,
) -> (Result<ClientOutcome, ProtocolError>, Option<HandshakeEvent>) {
    let mut server = ServerHandshake::new();
    let mut client = ClientHandshake::new(config);
    let mut client_outcome = None;
    let mut server_event = None;
    for _ in 0..1000 {
        let to_client = server.take_output();
        if !to_client.is_empty() && client_outcome.is_none() {
            for c in pieces(&to_client, trickle) {
                match client.input(c) {
                    Ok(Some(o)) => client_outcome = Some(Ok(o)),
                    Ok(None) => {}
                    Err(e) => return (Err(e), server_event),
                }
            }
        }
        let to_server = client.take_output();
        if to_server.is_empty() && client_outcome.is_some() {
            break;
        }
        if !to_server.is_empty() && server_event.is_none() {
            for c in pieces(&to_server, trickle) {
                if server_event.is_some() {
                    break;
                }
                server_event = server
                    .input(c, exports)
                    .expect("server accepts a well-behaved client");
            }
        }
        if server_event.is_some() && client_outcome.is_some() {
            break;
        }
    }
    // Deliver the server's last replies (e.g. the GO ACK).
    let last = server.take_output();
    if client_outcome.is_none() && !last.is_empty() {
        match client.input(&last) {
            Ok(Some(o)) => client_outcome = Some(Ok(o)),
            Ok(None) => {}
            Err(e) => return (Err(e), server_event),
        }
    }
    (client_outcome.expect("client finished"), server_event)
}

#[test]
fn go_with_structured_replies_and_base_allocation() {
    for trickle in [false, true] {
        let (client, server) = pump(ClientConfig::go("vol-a"), &catalog(), trickle);
        let ClientOutcome::Connected(export) = client.unwrap() else {
            panic!("not connected")
        };
        assert_eq!(export.size_bytes, 1 << 20);
        assert_eq!(export.description, "first volume");
        assert!(export.structured_replies);
        assert_eq!(
            export.meta_contexts,
            vec![(BASE_ALLOCATION_ID_FOR_TEST, BASE_ALLOCATION.to_string())]
        );
        assert_eq!(
            export.block_size.unwrap().max_payload_bytes,
            DEFAULT_MAX_PAYLOAD
        );
        let flags = export.transmission_flags;
        assert!(
            flags & FLAG_HAS_FLAGS != 0
                && flags & FLAG_CAN_MULTI_CONN != 0
                && flags & FLAG_SEND_DF != 0
        );
        assert_eq!(flags & FLAG_READ_ONLY, 0);
        let Some(HandshakeEvent::ExportChosen(info)) = server else {
            panic!("server did not choose")
        };
        assert_eq!(info, export.export_info(), "both sides agree");
        assert_eq!(info.base_allocation_id, Some(BASE_ALLOCATION_ID_FOR_TEST));
    }
}

const BASE_ALLOCATION_ID_FOR_TEST: u32 = weir_nbd::BASE_ALLOCATION_ID;

#[test]
fn go_without_structured_replies_has_no_df_and_no_contexts() {
    let config = ClientConfig {
        structured_replies: false,
        ..ClientConfig::go("vol-b")
    };
    let (client, server) = pump(config, &catalog(), false);
    let ClientOutcome::Connected(export) = client.unwrap() else {
        panic!()
    };
    assert!(!export.structured_replies);
    assert!(export.meta_contexts.is_empty());
    assert_eq!(export.transmission_flags & FLAG_SEND_DF, 0);
    assert_ne!(export.transmission_flags & FLAG_READ_ONLY, 0);
    let Some(HandshakeEvent::ExportChosen(info)) = server else {
        panic!()
    };
    assert_eq!(info.base_allocation_id, None);
}

#[test]
fn list_shows_what_the_catalog_shows_then_aborts() {
    let (client, server) = pump(ClientConfig::list(), &catalog(), false);
    let ClientOutcome::Listed(list) = client.unwrap() else {
        panic!()
    };
    let names: Vec<_> = list.iter().map(|e| e.name.as_str()).collect();
    assert_eq!(names, ["vol-a", "vol-b"]);
    assert_eq!(list[0].description, "first volume");
    assert_eq!(server, Some(HandshakeEvent::Aborted));
}

#[test]
fn info_then_abort() {
    let config = ClientConfig {
        goal: ClientGoal::Info,
        ..ClientConfig::go("vol-b")
    };
    let (client, server) = pump(config, &catalog(), false);
    let ClientOutcome::Info(export) = client.unwrap() else {
        panic!()
    };
    assert_eq!(export.size_bytes, 4096);
    assert_eq!(server, Some(HandshakeEvent::Aborted));
}

#[test]
fn go_to_unknown_export_is_refused_with_err_unknown() {
    let (client, server) = pump(ClientConfig::go("nope"), &catalog(), false);
    match client {
        Err(ProtocolError::OptionRefused {
            option,
            reply,
            message,
        }) => {
            assert_eq!(option, OPT_GO);
            assert_eq!(reply, REP_ERR_UNKNOWN);
            assert!(message.contains("nope"));
        }
        other => panic!("unexpected {other:?}"),
    }
    assert_eq!(server, None);
}

// --- raw byte-level tests of the server -------------------------------------------

fn opt(option: u32, data: &[u8]) -> Vec<u8> {
    let mut v = IHAVEOPT.to_be_bytes().to_vec();
    v.extend_from_slice(&option.to_be_bytes());
    v.extend_from_slice(&(data.len() as u32).to_be_bytes());
    v.extend_from_slice(data);
    v
}

/// Parses option replies: (option, type, data).
fn replies(mut bytes: &[u8]) -> Vec<(u32, u32, Vec<u8>)> {
    let mut out = vec![];
    while bytes.len() >= 20 {
        assert_eq!(
            u64::from_be_bytes(bytes[..8].try_into().unwrap()),
            REPLY_MAGIC
        );
        let o = u32::from_be_bytes(bytes[8..12].try_into().unwrap());
        let t = u32::from_be_bytes(bytes[12..16].try_into().unwrap());
        let l = u32::from_be_bytes(bytes[16..20].try_into().unwrap()) as usize;
        out.push((o, t, bytes[20..20 + l].to_vec()));
        bytes = &bytes[20 + l..];
    }
    assert!(bytes.is_empty(), "trailing bytes");
    out
}

fn started(flags: u32) -> ServerHandshake {
    let mut s = ServerHandshake::new();
    let greeting = s.take_output();
    assert_eq!(greeting.len(), 18);
    assert_eq!(&greeting[..8], b"NBDMAGIC");
    assert_eq!(&greeting[8..16], b"IHAVEOPT");
    assert_eq!(
        u16::from_be_bytes([greeting[16], greeting[17]]),
        FLAG_FIXED_NEWSTYLE | FLAG_NO_ZEROES
    );
    assert_eq!(s.input(&flags.to_be_bytes(), &catalog()).unwrap(), None);
    s
}

fn info_data(name: &str, infos: &[u16]) -> Vec<u8> {
    let mut d = (name.len() as u32).to_be_bytes().to_vec();
    d.extend_from_slice(name.as_bytes());
    d.extend_from_slice(&(infos.len() as u16).to_be_bytes());
    for i in infos {
        d.extend_from_slice(&i.to_be_bytes());
    }
    d
}

#[test]
fn unknown_client_flags_close_the_connection() {
    let mut s = ServerHandshake::new();
    s.take_output();
    assert_eq!(
        s.input(&4u32.to_be_bytes(), &catalog()),
        Err(ProtocolError::BadClientFlags(4))
    );
}

#[test]
fn bad_option_magic_closes_the_connection() {
    let mut s = started(FLAG_C_FIXED_NEWSTYLE);
    let mut bad = opt(OPT_LIST, &[]);
    bad[0] ^= 0xff;
    assert!(matches!(
        s.input(&bad, &catalog()),
        Err(ProtocolError::BadMagic { .. })
    ));
}

#[test]
fn unknown_options_get_err_unsup_and_parsing_continues() {
    let mut s = started(FLAG_C_FIXED_NEWSTYLE | FLAG_C_NO_ZEROES);
    let mut input = opt(0x1234, b"whatever");
    input.extend(opt(OPT_STARTTLS, &[]));
    input.extend(opt(OPT_EXTENDED_HEADERS, &[]));
    input.extend(opt(OPT_LIST, &[]));
    assert_eq!(s.input(&input, &catalog()).unwrap(), None);
    let r = replies(&s.take_output());
    assert_eq!(r[0].0, 0x1234);
    assert_eq!(r[0].1, REP_ERR_UNSUP);
    assert_eq!(r[1].1, REP_ERR_UNSUP);
    assert_eq!(r[2].1, REP_ERR_UNSUP);
    assert_eq!(r.iter().filter(|x| x.1 == REP_SERVER).count(), 2);
    assert_eq!(r.last().unwrap().1, REP_ACK);
}

#[test]
fn malformed_option_data_gets_err_invalid() {
    let mut s = started(FLAG_C_FIXED_NEWSTYLE);
    let mut input = opt(OPT_LIST, b"x"); // LIST takes no data
    input.extend(opt(OPT_STRUCTURED_REPLY, b"x"));
    let mut short = info_data("vol-a", &[INFO_NAME]);
    short.pop(); // info request count no longer matches
    input.extend(opt(OPT_INFO, &short));
    input.extend(opt(OPT_GO, &[0, 0, 0, 200, b'a'])); // name length beyond the data
    input.extend(opt(OPT_SET_META_CONTEXT, &[])); // structured replies not negotiated
    let mut bad_utf8 = info_data("ab", &[]);
    bad_utf8[4] = 0xff;
    input.extend(opt(OPT_GO, &bad_utf8));
    assert_eq!(s.input(&input, &catalog()).unwrap(), None);
    let r = replies(&s.take_output());
    assert_eq!(r.len(), 6);
    assert!(r.iter().all(|x| x.1 == REP_ERR_INVALID), "{r:?}");
    // The connection is still usable.
    let go = opt(OPT_GO, &info_data("vol-a", &[]));
    assert!(matches!(
        s.input(&go, &catalog()).unwrap(),
        Some(HandshakeEvent::ExportChosen(_))
    ));
}

#[test]
fn meta_context_queries() {
    let mut s = started(FLAG_C_FIXED_NEWSTYLE);
    let meta = |name: &str, queries: &[&str]| {
        let mut d = (name.len() as u32).to_be_bytes().to_vec();
        d.extend_from_slice(name.as_bytes());
        d.extend_from_slice(&(queries.len() as u32).to_be_bytes());
        for q in queries {
            d.extend_from_slice(&(q.len() as u32).to_be_bytes());
            d.extend_from_slice(q.as_bytes());
        }
        d
    };
    let mut input = opt(OPT_STRUCTURED_REPLY, &[]);
    input.extend(opt(OPT_LIST_META_CONTEXT, &meta("vol-a", &[]))); // all contexts
    input.extend(opt(OPT_LIST_META_CONTEXT, &meta("vol-a", &["base:"]))); // wildcard
    input.extend(opt(
        OPT_LIST_META_CONTEXT,
        &meta("vol-a", &["qemu:dirty-bitmap:x"]),
    )); // unknown namespace
    input.extend(opt(OPT_LIST_META_CONTEXT, &meta("vol-a", &["nocolon"]))); // invalid
    input.extend(opt(
        OPT_SET_META_CONTEXT,
        &meta("vol-a", &["base:", "x-foo:bar"]),
    )); // selects nothing
    input.extend(opt(
        OPT_SET_META_CONTEXT,
        &meta("hidden", &["base:allocation"]),
    )); // unknown export
    input.extend(opt(
        OPT_SET_META_CONTEXT,
        &meta("vol-a", &["base:allocation"]),
    ));
    assert_eq!(s.input(&input, &catalog()).unwrap(), None);
    let r: Vec<(u32, u32)> = replies(&s.take_output())
        .into_iter()
        .map(|(o, t, _)| (o, t))
        .collect();
    let l = OPT_LIST_META_CONTEXT;
    let st = OPT_SET_META_CONTEXT;
    assert_eq!(
        r,
        vec![
            (OPT_STRUCTURED_REPLY, REP_ACK),
            (l, REP_META_CONTEXT),
            (l, REP_ACK),
            (l, REP_META_CONTEXT),
            (l, REP_ACK),
            (l, REP_ACK),
            (l, REP_ERR_INVALID),
            (st, REP_ACK),
            (st, REP_ERR_UNKNOWN),
            (st, REP_META_CONTEXT),
            (st, REP_ACK),
        ]
    );
    // GO to the same export: base:allocation is active.
    let ev = s
        .input(&opt(OPT_GO, &info_data("vol-a", &[])), &catalog())
        .unwrap();
    let Some(HandshakeEvent::ExportChosen(info)) = ev else {
        panic!()
    };
    assert_eq!(info.base_allocation_id, Some(weir_nbd::BASE_ALLOCATION_ID));
}

#[test]
fn contexts_selected_for_another_export_do_not_carry_over() {
    let mut s = started(FLAG_C_FIXED_NEWSTYLE);
    let mut d = 5u32.to_be_bytes().to_vec();
    d.extend_from_slice(b"vol-b");
    d.extend_from_slice(&1u32.to_be_bytes());
    d.extend_from_slice(&15u32.to_be_bytes());
    d.extend_from_slice(b"base:allocation");
    let mut input = opt(OPT_STRUCTURED_REPLY, &[]);
    input.extend(opt(OPT_SET_META_CONTEXT, &d));
    input.extend(opt(OPT_GO, &info_data("vol-a", &[])));
    let Some(HandshakeEvent::ExportChosen(info)) = s.input(&input, &catalog()).unwrap() else {
        panic!()
    };
    assert_eq!(info.base_allocation_id, None);
}

#[test]
fn info_replies_carry_requested_items_and_block_size() {
    let mut s = started(FLAG_C_FIXED_NEWSTYLE);
    let data = info_data(
        "vol-a",
        &[INFO_NAME, INFO_DESCRIPTION, INFO_BLOCK_SIZE, 999],
    );
    assert_eq!(s.input(&opt(OPT_INFO, &data), &catalog()).unwrap(), None);
    let r = replies(&s.take_output());
    let infos: Vec<u16> = r
        .iter()
        .filter(|x| x.1 == REP_INFO)
        .map(|x| u16::from_be_bytes([x.2[0], x.2[1]]))
        .collect();
    assert_eq!(
        infos,
        [INFO_EXPORT, INFO_NAME, INFO_DESCRIPTION, INFO_BLOCK_SIZE]
    );
    let export = &r[0].2;
    assert_eq!(export.len(), 12);
    assert_eq!(
        u64::from_be_bytes(export[2..10].try_into().unwrap()),
        1 << 20
    );
    let bs = &r[3].2;
    assert_eq!(bs.len(), 14);
    assert_eq!(
        u32::from_be_bytes(bs[10..14].try_into().unwrap()),
        DEFAULT_MAX_PAYLOAD
    );
    assert_eq!(r.last().unwrap().1, REP_ACK);
    assert!(!s.is_finished(), "INFO does not end the handshake");
}

#[test]
fn export_name_with_and_without_zeroes_and_leftover() {
    for (flags, expected_len) in [
        (FLAG_C_FIXED_NEWSTYLE | FLAG_C_NO_ZEROES, 10),
        (FLAG_C_FIXED_NEWSTYLE, 134),
    ] {
        let mut s = started(flags);
        let mut input = opt(OPT_EXPORT_NAME, b"vol-b");
        input.extend_from_slice(b"\x25\x60\x95\x13tail"); // start of the first request
        let Some(HandshakeEvent::ExportChosen(info)) = s.input(&input, &catalog()).unwrap() else {
            panic!()
        };
        let out = s.take_output();
        assert_eq!(out.len(), expected_len);
        assert_eq!(u64::from_be_bytes(out[..8].try_into().unwrap()), 4096);
        assert_eq!(
            u16::from_be_bytes([out[8], out[9]]),
            info.transmission_flags
        );
        assert_eq!(s.take_leftover(), b"\x25\x60\x95\x13tail");
        assert!(
            s.input(b"more", &catalog()).is_err(),
            "finished handshake refuses input"
        );
    }
}

#[test]
fn export_name_for_an_unknown_export_closes() {
    let mut s = started(FLAG_C_FIXED_NEWSTYLE);
    let r = s.input(&opt(OPT_EXPORT_NAME, b"hidden"), &catalog());
    assert_eq!(r, Err(ProtocolError::UnknownExport("hidden".into())));
}

/// An option header declaring `len` bytes of data (none of which follow).
fn option_header(option: u32, len: u32) -> Vec<u8> {
    let mut header = IHAVEOPT.to_be_bytes().to_vec();
    header.extend_from_slice(&option.to_be_bytes());
    header.extend_from_slice(&len.to_be_bytes());
    header
}

#[test]
fn oversized_option_is_refused_at_once_without_reading_its_data() {
    for len in [MAX_OPTION_LEN + 1, u32::MAX] {
        let mut s = started(FLAG_C_FIXED_NEWSTYLE);
        // The header alone is enough: no wait for (and no discarding of) the data.
        let r = s.input(&option_header(OPT_INFO, len), &catalog());
        // The server's log blames the client, not "the server".
        let e = r.expect_err("refused").to_string();
        assert!(
            e.starts_with("client sent an unexpected option length"),
            "{e}"
        );
        assert!(s.is_finished());
        let r = replies(&s.take_output());
        assert_eq!(r.len(), 1);
        assert_eq!((r[0].0, r[0].1), (OPT_INFO, REP_ERR_TOO_BIG));
        let msg = String::from_utf8(r[0].2.clone()).unwrap();
        assert!(msg.contains(&len.to_string()), "{msg}");
    }
    // The largest allowed option is still read and answered.
    let mut s = started(FLAG_C_FIXED_NEWSTYLE);
    let data = vec![0u8; MAX_OPTION_LEN as usize];
    assert_eq!(s.input(&opt(OPT_INFO, &data), &catalog()).unwrap(), None);
    assert_eq!(replies(&s.take_output())[0].1, REP_ERR_INVALID);
    // EXPORT_NAME cannot be answered: it closes; ABORT is still acknowledged.
    let mut s = started(FLAG_C_FIXED_NEWSTYLE);
    let r = s.input(&option_header(OPT_EXPORT_NAME, u32::MAX), &catalog());
    assert_eq!(r, Err(ProtocolError::ExportNameTooLong(u32::MAX)));
    let mut s = started(FLAG_C_FIXED_NEWSTYLE);
    let r = s.input(&option_header(OPT_ABORT, u32::MAX), &catalog());
    assert_eq!(r, Ok(Some(HandshakeEvent::Aborted)));
    assert_eq!(
        replies(&s.take_output()),
        vec![(OPT_ABORT, REP_ACK, vec![])]
    );
}

#[test]
fn a_refused_client_gets_err_policy_with_the_reason() {
    let mut s = started(FLAG_C_FIXED_NEWSTYLE);
    s.refuse("too many connections from 10.0.0.1");
    let go = opt(OPT_GO, &info_data("vol-a", &[]));
    for option in [go, opt(OPT_LIST, &[]), opt(OPT_STRUCTURED_REPLY, &[])] {
        assert_eq!(s.input(&option, &catalog()).unwrap(), None);
        let r = replies(&s.take_output());
        assert_eq!(r.len(), 1);
        assert_eq!(r[0].1, REP_ERR_POLICY);
        assert_eq!(r[0].2, b"too many connections from 10.0.0.1");
    }
    assert_eq!(
        s.input(&opt(OPT_ABORT, &[]), &catalog()).unwrap(),
        Some(HandshakeEvent::Aborted)
    );
    let mut s = started(FLAG_C_FIXED_NEWSTYLE);
    s.refuse("no");
    assert!(
        s.input(&opt(OPT_EXPORT_NAME, b"vol-a"), &catalog())
            .is_err()
    );
}

#[test]
fn descriptions_reach_clients_without_control_characters() {
    let mut a = ExportDescription::new("vol-a", 1 << 20);
    a.description = "evil\x1b[2J\x07 desc\u{9b}31m\nend".into();
    let exports = vec![a];
    let clean = "evil\u{FFFD}[2J\u{FFFD} desc\u{FFFD}31m\u{FFFD}end";
    let mut s = started(FLAG_C_FIXED_NEWSTYLE);
    assert_eq!(s.input(&opt(OPT_LIST, &[]), &exports).unwrap(), None);
    let r = replies(&s.take_output());
    assert_eq!(r[0].1, REP_SERVER);
    assert_eq!(&r[0].2[4..9], b"vol-a");
    assert_eq!(std::str::from_utf8(&r[0].2[9..]).unwrap(), clean);
    let data = info_data("vol-a", &[INFO_DESCRIPTION]);
    assert_eq!(s.input(&opt(OPT_INFO, &data), &exports).unwrap(), None);
    let r = replies(&s.take_output());
    let d = r
        .iter()
        .find(|x| x.1 == REP_INFO && x.2[..2] == INFO_DESCRIPTION.to_be_bytes())
        .expect("description sent");
    assert_eq!(std::str::from_utf8(&d.2[2..]).unwrap(), clean);
    // Long descriptions are cut to the protocol's string limit, at a char boundary.
    let long = "\u{e9}".repeat(MAX_STRING_LEN);
    let p = weir_nbd::printable(&long);
    assert!(p.len() <= MAX_STRING_LEN && p.len() >= MAX_STRING_LEN - 1);
    assert!(matches!(
        weir_nbd::printable("plain"),
        std::borrow::Cow::Borrowed(_)
    ));
}

#[test]
fn pipelined_options_produce_bounded_replies_per_input() {
    // Eight exports with 4,000-byte descriptions: one LIST answers ~32 KB. A
    // client sending 1,000 LISTs in one read (and reading nothing) used to get
    // all 32 MB of replies built at once.
    let exports: Vec<ExportDescription> = (0..8)
        .map(|i| {
            let mut e = ExportDescription::new(format!("vol-{i}"), 1 << 20);
            e.description = "d".repeat(4000);
            e
        })
        .collect();
    let one_list = {
        let mut s = started(FLAG_C_FIXED_NEWSTYLE);
        s.input(&opt(OPT_LIST, &[]), &exports).unwrap();
        s.take_output().len()
    };
    let mut s = started(FLAG_C_FIXED_NEWSTYLE);
    let lists: Vec<u8> = (0..1000).flat_map(|_| opt(OPT_LIST, &[])).collect();
    assert_eq!(s.input(&lists, &exports).unwrap(), None);
    let mut acks = 0;
    let mut rounds = 0;
    loop {
        let out = s.take_output();
        assert!(
            out.len() < ServerHandshake::MAX_OUTPUT + one_list,
            "{} bytes of replies from one input",
            out.len()
        );
        acks += replies(&out).iter().filter(|r| r.1 == REP_ACK).count();
        if !s.has_buffered_options() {
            break;
        }
        rounds += 1;
        assert_eq!(s.input(&[], &exports).unwrap(), None);
    }
    // Every option is still answered, in order, once the output is sent.
    assert_eq!(acks, 1000);
    assert!(rounds > 100, "{rounds} rounds");
    // A GO after them still works.
    let go = opt(OPT_GO, &info_data("vol-3", &[]));
    let Some(HandshakeEvent::ExportChosen(info)) = s.input(&go, &exports).unwrap() else {
        panic!("GO not answered")
    };
    assert_eq!(info.name, "vol-3");
}

#[test]
fn abort_is_acknowledged() {
    let mut s = started(FLAG_C_FIXED_NEWSTYLE);
    assert_eq!(
        s.input(&opt(OPT_ABORT, b"ignored"), &catalog()).unwrap(),
        Some(HandshakeEvent::Aborted)
    );
    assert_eq!(
        replies(&s.take_output()),
        vec![(OPT_ABORT, REP_ACK, vec![])]
    );
}

#[test]
fn shutdown_refuses_options_but_not_abort() {
    let mut s = started(FLAG_C_FIXED_NEWSTYLE);
    s.begin_shutdown();
    assert_eq!(
        s.input(&opt(OPT_GO, &info_data("vol-a", &[])), &catalog())
            .unwrap(),
        None
    );
    assert_eq!(replies(&s.take_output())[0].1, REP_ERR_SHUTDOWN);
    assert_eq!(
        s.input(&opt(OPT_ABORT, &[]), &catalog()).unwrap(),
        Some(HandshakeEvent::Aborted)
    );
}

#[test]
fn export_info_matches_catalog_flags() {
    let info: ExportInfo = {
        let mut s = started(FLAG_C_FIXED_NEWSTYLE);
        let Some(HandshakeEvent::ExportChosen(i)) = s
            .input(&opt(OPT_GO, &info_data("vol-b", &[])), &catalog())
            .unwrap()
        else {
            panic!()
        };
        i
    };
    assert!(info.read_only());
    assert!(!info.structured_replies);
    assert_eq!(info.transmission_flags & FLAG_CAN_MULTI_CONN, 0);
}

/// An old server without structured replies or NBD_OPT_GO: the client falls back
/// to NBD_OPT_EXPORT_NAME and reads the 124 zero bytes it did not negotiate away.
#[test]
fn client_falls_back_to_export_name_on_old_servers() {
    let mut c = ClientHandshake::new(ClientConfig::go("old"));
    let mut greeting = NBDMAGIC.to_be_bytes().to_vec();
    greeting.extend(IHAVEOPT.to_be_bytes());
    greeting.extend(FLAG_FIXED_NEWSTYLE.to_be_bytes()); // no NO_ZEROES
    assert_eq!(c.input(&greeting).unwrap(), None);
    let out = c.take_output();
    assert_eq!(
        &out[..4],
        &FLAG_C_FIXED_NEWSTYLE.to_be_bytes(),
        "no NO_ZEROES flag sent"
    );
    assert_eq!(
        u32::from_be_bytes(out[12..16].try_into().unwrap()),
        OPT_STRUCTURED_REPLY
    );
    let rep = |option: u32, t: u32| {
        let mut v = REPLY_MAGIC.to_be_bytes().to_vec();
        v.extend(option.to_be_bytes());
        v.extend(t.to_be_bytes());
        v.extend(0u32.to_be_bytes());
        v
    };
    assert_eq!(
        c.input(&rep(OPT_STRUCTURED_REPLY, REP_ERR_UNSUP)).unwrap(),
        None
    );
    let out = c.take_output();
    assert_eq!(
        u32::from_be_bytes(out[8..12].try_into().unwrap()),
        OPT_GO,
        "no meta contexts without structured replies"
    );
    assert_eq!(c.input(&rep(OPT_GO, REP_ERR_UNSUP)).unwrap(), None);
    let out = c.take_output();
    assert_eq!(
        u32::from_be_bytes(out[8..12].try_into().unwrap()),
        OPT_EXPORT_NAME
    );
    assert_eq!(&out[16..], b"old");
    let mut reply = (1u64 << 30).to_be_bytes().to_vec();
    reply.extend((FLAG_HAS_FLAGS | FLAG_READ_ONLY).to_be_bytes());
    reply.extend([0u8; 124]);
    let (first, second) = reply.split_at(70);
    assert_eq!(c.input(first).unwrap(), None);
    let Some(ClientOutcome::Connected(export)) = c.input(second).unwrap() else {
        panic!()
    };
    assert_eq!(export.size_bytes, 1 << 30);
    assert!(!export.structured_replies);
    assert!(export.export_info().read_only());
}

/// A server under `policy` past the client flags.
fn started_tls(policy: weir_nbd::TlsPolicy, flags: u32) -> ServerHandshake {
    let mut s = ServerHandshake::with_tls(policy);
    s.take_output();
    assert_eq!(s.input(&flags.to_be_bytes(), &catalog()).unwrap(), None);
    s
}

#[test]
fn required_tls_refuses_every_option_before_starttls_and_reveals_no_export() {
    use weir_nbd::TlsPolicy;
    let mut s = started_tls(TlsPolicy::Required, FLAG_C_FIXED_NEWSTYLE);
    let mut input = opt(OPT_LIST, &[]);
    input.extend(opt(OPT_INFO, &info_data("vol-a", &[INFO_NAME])));
    input.extend(opt(OPT_GO, &info_data("vol-a", &[])));
    input.extend(opt(OPT_STRUCTURED_REPLY, &[]));
    input.extend(opt(0x1234, b"x"));
    assert_eq!(s.input(&input, &catalog()).unwrap(), None);
    let out = s.take_output();
    let r = replies(&out);
    assert_eq!(r.len(), 5, "{r:?}");
    assert!(r.iter().all(|x| x.1 == REP_ERR_TLS_REQD), "{r:?}");
    let text = String::from_utf8_lossy(&out);
    assert!(!text.contains("vol-"), "an export name leaked: {text:?}");
    // STARTTLS is acknowledged; nothing may follow in plain text.
    let ev = s.input(&opt(OPT_STARTTLS, &[]), &catalog()).unwrap();
    assert_eq!(ev, Some(HandshakeEvent::StartTls));
    assert_eq!(replies(&s.take_output()), [(OPT_STARTTLS, REP_ACK, vec![])]);
    assert!(s.input(&opt(OPT_LIST, &[]), &catalog()).is_err());

    // Over TLS, options work; a second STARTTLS is invalid; never TLS_REQD again.
    let mut s = started_tls(TlsPolicy::Required, FLAG_C_FIXED_NEWSTYLE);
    assert_eq!(
        s.input(&opt(OPT_STARTTLS, &[]), &catalog()).unwrap(),
        Some(HandshakeEvent::StartTls)
    );
    s.take_output();
    s.tls_started();
    assert!(s.tls_active());
    let mut input = opt(OPT_STARTTLS, &[]);
    input.extend(opt(OPT_LIST, &[]));
    assert_eq!(s.input(&input, &catalog()).unwrap(), None);
    let r = replies(&s.take_output());
    assert_eq!(r[0].1, REP_ERR_INVALID);
    assert_eq!(r.iter().filter(|x| x.1 == REP_SERVER).count(), 2);
    let ev = s
        .input(&opt(OPT_GO, &info_data("vol-a", &[])), &catalog())
        .unwrap();
    assert!(
        matches!(ev, Some(HandshakeEvent::ExportChosen(_))),
        "{ev:?}"
    );

    // EXPORT_NAME cannot be refused: the connection closes.
    let mut s = started_tls(TlsPolicy::Required, FLAG_C_FIXED_NEWSTYLE);
    assert!(
        s.input(&opt(OPT_EXPORT_NAME, b"vol-a"), &catalog())
            .is_err()
    );
    assert!(replies(&s.take_output()).is_empty());
    // ABORT is still answered.
    let mut s = started_tls(TlsPolicy::Required, FLAG_C_FIXED_NEWSTYLE);
    assert_eq!(
        s.input(&opt(OPT_ABORT, &[]), &catalog()).unwrap(),
        Some(HandshakeEvent::Aborted)
    );
}

#[test]
fn optional_tls_serves_plain_options_and_starttls_resets_negotiation() {
    use weir_nbd::TlsPolicy;
    let mut s = started_tls(TlsPolicy::Optional, FLAG_C_FIXED_NEWSTYLE);
    let mut input = opt(OPT_LIST, &[]);
    input.extend(opt(OPT_STRUCTURED_REPLY, &[]));
    assert_eq!(s.input(&input, &catalog()).unwrap(), None);
    let r = replies(&s.take_output());
    assert_eq!(r.iter().filter(|x| x.1 == REP_SERVER).count(), 2);
    assert_eq!(r.last().unwrap().1, REP_ACK);
    // STARTTLS with data is invalid; then a proper one is acknowledged.
    assert_eq!(s.input(&opt(OPT_STARTTLS, b"x"), &catalog()).unwrap(), None);
    assert_eq!(replies(&s.take_output())[0].1, REP_ERR_INVALID);
    assert_eq!(
        s.input(&opt(OPT_STARTTLS, &[]), &catalog()).unwrap(),
        Some(HandshakeEvent::StartTls)
    );
    s.take_output();
    s.tls_started();
    // Structured replies negotiated in plain text do not carry over.
    let ev = s
        .input(&opt(OPT_GO, &info_data("vol-a", &[])), &catalog())
        .unwrap();
    let Some(HandshakeEvent::ExportChosen(info)) = ev else {
        panic!("{ev:?}")
    };
    assert!(!info.structured_replies);

    // TLS needs fixed newstyle; with TLS off STARTTLS is unsupported.
    let mut s = started_tls(TlsPolicy::Optional, 0);
    assert_eq!(s.input(&opt(OPT_STARTTLS, &[]), &catalog()).unwrap(), None);
    assert_eq!(replies(&s.take_output())[0].1, REP_ERR_UNSUP);
    let mut s = started_tls(TlsPolicy::Off, FLAG_C_FIXED_NEWSTYLE);
    assert_eq!(s.input(&opt(OPT_STARTTLS, &[]), &catalog()).unwrap(), None);
    assert_eq!(replies(&s.take_output())[0].1, REP_ERR_UNSUP);
    // Bytes pipelined behind STARTTLS (before its ACK) close the connection.
    let mut s = started_tls(TlsPolicy::Optional, FLAG_C_FIXED_NEWSTYLE);
    let mut input = opt(OPT_STARTTLS, &[]);
    input.extend(opt(OPT_LIST, &[]));
    assert!(s.input(&input, &catalog()).is_err());
}

/// A client asking for STARTTLS against a server that requires TLS: both pause at
/// the acknowledgement (the TLS handshake happens there; here the bytes pass as
/// they are), then the client's usual options follow and it connects. A server
/// without TLS refuses, and the client gives up instead of going on in plain text.
#[test]
fn starttls_pauses_both_sides_then_goes_on() {
    use weir_nbd::TlsPolicy;
    let config = ClientConfig {
        starttls: true,
        ..ClientConfig::go("vol-a")
    };
    let mut server = ServerHandshake::with_tls(TlsPolicy::Required);
    let mut client = ClientHandshake::new(config.clone());
    let mut client_paused = false;
    let mut server_paused = false;
    let mut outcome = None;
    let mut chosen = None;
    for _ in 0..100 {
        let to_client = server.take_output();
        if !to_client.is_empty() {
            match client.input(&to_client).unwrap() {
                Some(ClientOutcome::StartTls) => {
                    client_paused = true;
                    assert!(
                        client.take_output().is_empty(),
                        "nothing sent in plain text"
                    );
                    assert!(server_paused, "the server acknowledged first");
                    // ... the TLS handshake ...
                    server.tls_started();
                    assert_eq!(client.tls_started().unwrap(), None);
                }
                Some(o) => outcome = Some(o),
                None => {}
            }
        }
        let to_server = client.take_output();
        if !to_server.is_empty() {
            match server.input(&to_server, &catalog()).unwrap() {
                Some(HandshakeEvent::StartTls) => server_paused = true,
                Some(HandshakeEvent::ExportChosen(info)) => chosen = Some(info),
                Some(e) => panic!("{e:?}"),
                None => {}
            }
        }
        if outcome.is_some() {
            break;
        }
    }
    assert!(client_paused && server_paused && server.tls_active());
    let Some(ClientOutcome::Connected(export)) = outcome else {
        panic!("not connected: {outcome:?}")
    };
    assert!(export.structured_replies, "options sent again over TLS");
    assert_eq!(chosen.unwrap(), export.export_info());

    // A server without TLS: the client does not fall back to plain text.
    let (client, _) = pump(config, &catalog(), false);
    assert!(
        matches!(
            client,
            Err(ProtocolError::OptionRefused {
                option: OPT_STARTTLS,
                ..
            })
        ),
        "{client:?}"
    );
    // No tls_started without an acknowledgement.
    assert!(
        ClientHandshake::new(ClientConfig::go("x"))
            .tls_started()
            .is_err()
    );
}

/// A catalog whose `vol-a` grants the lease `good` only.
struct Leasing(Vec<ExportDescription>);
impl weir_nbd::ExportCatalog for Leasing {
    fn list(&self) -> Vec<weir_nbd::ExportListing> {
        self.0.list()
    }
    fn lookup(&self, name: &str) -> Option<ExportDescription> {
        self.0.lookup(name)
    }
    fn lease_available(&self, export: &str, token: &str) -> bool {
        export == "vol-a" && token == "good"
    }
}

#[test]
fn an_exclusive_lease_is_selected_only_when_the_catalog_grants_it() {
    let leasing = Leasing(catalog());
    let connect = |token: &str, catalog: &dyn weir_nbd::ExportCatalog| {
        let config = ClientConfig {
            meta_contexts: vec![
                BASE_ALLOCATION.to_string(),
                format!("{WEIR_EXCLUSIVE_PREFIX}{token}"),
            ],
            ..ClientConfig::go("vol-a")
        };
        let (client, server) = pump(config, catalog, false);
        let Ok(ClientOutcome::Connected(ex)) = client else {
            panic!("{client:?}")
        };
        let Some(HandshakeEvent::ExportChosen(info)) = server else {
            panic!("{server:?}")
        };
        (ex, info)
    };
    let (ex, info) = connect("good", &leasing);
    assert_eq!(info.exclusive_lease.as_deref(), Some("good"));
    assert_eq!(ex.export_info().exclusive_lease.as_deref(), Some("good"));
    assert!(
        ex.meta_contexts
            .contains(&(weir_nbd::LEASE_CONTEXT_ID, "weir:exclusive=good".into()))
    );
    // base:allocation is still selected beside it.
    assert_eq!(info.base_allocation_id, Some(weir_nbd::BASE_ALLOCATION_ID));
    // Another token, or a catalog without leases: nothing is selected, and the
    // client learns it.
    for (token, catalog) in [
        ("other", &leasing as &dyn weir_nbd::ExportCatalog),
        ("good", &catalog() as &dyn weir_nbd::ExportCatalog),
        ("bad token!", &leasing as &dyn weir_nbd::ExportCatalog),
    ] {
        let (ex, info) = connect(token, catalog);
        assert_eq!(info.exclusive_lease, None, "{token}");
        assert_eq!(ex.export_info().exclusive_lease, None, "{token}");
        assert_eq!(info.base_allocation_id, Some(weir_nbd::BASE_ALLOCATION_ID));
    }
    assert!(weir_nbd::valid_lease_token("a-Z_9"));
    assert!(!weir_nbd::valid_lease_token(""));
    assert!(!weir_nbd::valid_lease_token(&"x".repeat(65)));
}
