//! Test peers: nbdkit on a loopback port, and a tiny in-test NBD server (built from
//! weir-nbd's server state machine) that can corrupt data or hang up.
#![allow(dead_code)]

use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use weir_nbd::{ExportDescription, HandshakeEvent, RequestDecoder, ServerHandshake, validate};

/// nbdkit installed (installing it with apt-get when missing and root); prints the
/// reason when it cannot be had.
pub fn nbdkit_available() -> bool {
    weir_testkit::require_tool("nbdkit", &["nbdkit", "libnbd-bin"])
}

fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .expect("a free loopback port")
}

/// An nbdkit process on 127.0.0.1, killed on drop.
pub struct Nbdkit {
    child: Child,
    pub port: u16,
}

impl Nbdkit {
    /// `nbdkit -f -i 127.0.0.1 -p PORT ARGS…`, waiting until it accepts connections.
    pub fn start(args: &[&str]) -> Nbdkit {
        for _ in 0..5 {
            let port = free_port();
            let child = Command::new("nbdkit")
                .args(["-f", "--exit-with-parent", "-i", "127.0.0.1", "-p"])
                .arg(port.to_string())
                .args(args)
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .spawn()
                .expect("nbdkit starts");
            let mut k = Nbdkit { child, port };
            let until = Instant::now() + Duration::from_secs(5);
            while Instant::now() < until {
                if let Ok(Some(_)) = k.child.try_wait() {
                    break; // port taken or bad arguments: try another port
                }
                if TcpStream::connect(("127.0.0.1", port)).is_ok() {
                    return k;
                }
                std::thread::sleep(Duration::from_millis(20));
            }
            let _ = k.child.kill();
        }
        panic!("nbdkit {args:?} did not start");
    }

    pub fn uri(&self) -> String {
        format!("nbd://127.0.0.1:{}/", self.port)
    }
}

impl Drop for Nbdkit {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// What the in-test server does wrong.
#[derive(Clone, Copy, Debug, Default)]
pub struct Misbehaviour {
    /// Flip one bit in every Nth READ reply that carries written data (0: never).
    pub flip_every_nth_read: u64,
    /// Drop the connection after this many requests (0: never).
    pub hang_up_after: u64,
    /// Answer each batch of requests read together in reverse order (legal: NBD
    /// replies may come in any order).
    pub reverse_replies: bool,
    /// Acknowledge every Nth WRITE without storing it (0: never).
    pub lose_every_nth_write: u64,
}

/// A tiny memory-backed NBD server on 127.0.0.1 (one thread per connection).
pub struct TestServer {
    pub port: u16,
    pub flipped: Arc<AtomicU64>,
    /// Batches of several replies sent in reverse order.
    pub reordered: Arc<AtomicU64>,
}

impl TestServer {
    pub fn start(size_bytes: u64, misbehaviour: Misbehaviour) -> TestServer {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let port = listener.local_addr().unwrap().port();
        let data = Arc::new(Mutex::new(vec![0u8; size_bytes as usize]));
        let flipped = Arc::new(AtomicU64::new(0));
        let reordered = Arc::new(AtomicU64::new(0));
        let f = flipped.clone();
        let r = reordered.clone();
        std::thread::spawn(move || {
            for stream in listener.incoming() {
                let Ok(stream) = stream else { return };
                let (data, f, r) = (data.clone(), f.clone(), r.clone());
                std::thread::spawn(move || {
                    let _ = serve(stream, size_bytes, &data, misbehaviour, &f, &r);
                });
            }
        });
        TestServer {
            port,
            flipped,
            reordered,
        }
    }

    pub fn uri(&self) -> String {
        format!("nbd://127.0.0.1:{}/mem", self.port)
    }
}

fn serve(
    mut stream: TcpStream,
    size_bytes: u64,
    data: &Mutex<Vec<u8>>,
    mis: Misbehaviour,
    flipped: &AtomicU64,
    reordered: &AtomicU64,
) -> std::io::Result<()> {
    stream.set_nodelay(true)?;
    let mut export = ExportDescription::new("mem", size_bytes);
    export.can_multi_conn = true;
    let catalog = vec![export];
    let mut hs = ServerHandshake::new();
    let mut buf = vec![0u8; 1 << 20];
    stream.write_all(&hs.take_output())?;
    let info = loop {
        let n = stream.read(&mut buf)?;
        if n == 0 {
            return Ok(());
        }
        let ev = hs
            .input(&buf[..n], &catalog)
            .map_err(|e| std::io::Error::other(e.to_string()))?;
        stream.write_all(&hs.take_output())?;
        match ev {
            Some(HandshakeEvent::ExportChosen(info)) => break info,
            Some(HandshakeEvent::Aborted) => return Ok(()),
            // Its handshake has TLS off: STARTTLS is refused, never acknowledged.
            Some(HandshakeEvent::StartTls) => unreachable!("TLS is off"),
            None => {}
        }
    };
    let mut decoder = RequestDecoder::new(info.block_size.max_payload_bytes);
    decoder.feed(&hs.take_leftover());
    let (mut requests, mut reads, mut writes) = (0u64, 0u64, 0u64);
    loop {
        let mut replies: Vec<Vec<u8>> = Vec::new();
        while let Some(req) = decoder
            .next_request()
            .map_err(|e| std::io::Error::other(e.to_string()))?
        {
            requests += 1;
            if mis.hang_up_after > 0 && requests > mis.hang_up_after {
                stream.write_all(&replies.concat())?;
                return Ok(());
            }
            let mut out = Vec::new();
            match validate(&req, &info) {
                Err(e) => weir_nbd::reply::error_reply(&mut out, &info, req.header.handle, &e),
                Ok(v) => match v.command {
                    weir_nbd::Command::Read { offset, length, .. } => {
                        let mut chunk = data.lock().unwrap()
                            [offset as usize..(offset + length as u64) as usize]
                            .to_vec();
                        if chunk.iter().any(|&b| b != 0) {
                            reads += 1;
                            if mis.flip_every_nth_read > 0 && reads % mis.flip_every_nth_read == 0 {
                                let at = (reads as usize * 7919) % chunk.len();
                                chunk[at] ^= 0x04;
                                flipped.fetch_add(1, Ordering::Relaxed);
                            }
                        }
                        weir_nbd::reply::read_reply(&mut out, &info, v.handle, offset, &chunk);
                    }
                    weir_nbd::Command::Write { offset, length, .. } => {
                        let payload = req.payload.as_deref().unwrap_or_default();
                        writes += 1;
                        let lose = mis.lose_every_nth_write > 0
                            && writes.is_multiple_of(mis.lose_every_nth_write);
                        if !lose {
                            data.lock().unwrap()
                                [offset as usize..(offset + length as u64) as usize]
                                .copy_from_slice(payload);
                        }
                        weir_nbd::reply::ok_reply(&mut out, v.handle);
                    }
                    weir_nbd::Command::Disconnect => {
                        stream.write_all(&replies.concat())?;
                        return Ok(());
                    }
                    _ => weir_nbd::reply::ok_reply(&mut out, v.handle),
                },
            }
            replies.push(out);
        }
        if mis.reverse_replies && replies.len() > 1 {
            replies.reverse();
            reordered.fetch_add(1, Ordering::Relaxed);
        }
        if !replies.is_empty() {
            stream.write_all(&replies.concat())?;
        }
        let n = stream.read(&mut buf)?;
        if n == 0 {
            return Ok(());
        }
        decoder.feed(&buf[..n]);
    }
}
