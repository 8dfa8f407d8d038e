//! One HTTP/1.1 exchange as a client: the admin CLI's side (`weir volume …`,
//! `weir top`). hyper parses the answer (Content-Length, chunked or
//! close-delimited), bounded in size; a peer that does not speak HTTP gets an
//! error that says so.

use std::net::SocketAddr;
use std::time::Duration;

use bytes::Bytes;
use http_body_util::{BodyExt, Full, LengthLimitError, Limited};
use hyper_util::rt::TokioIo;
use tokio::net::TcpStream;

/// Largest answer body accepted (larger: [`ExchangeError::Protocol`]).
pub const MAX_ANSWER_BYTES: usize = 256 << 20;
/// How long connecting may take.
pub const CONNECT_TIMEOUT: Duration = Duration::from_secs(10);

/// Why an exchange failed.
#[derive(Debug)]
pub enum ExchangeError {
    /// The connection could not be made (or was lost before an answer began).
    Connect(std::io::Error),
    /// The peer answered, but not with HTTP this client accepts.
    Protocol(String),
}

/// Sends `method path` with `headers` and `body` to `addr` on a new connection
/// (closed after it) and returns the answer's status and body.
pub async fn exchange(
    addr: SocketAddr,
    method: &str,
    path: &str,
    headers: &[(&str, String)],
    body: Vec<u8>,
) -> Result<(u16, Vec<u8>), ExchangeError> {
    exchange_within(addr, method, path, headers, body, MAX_ANSWER_BYTES).await
}

async fn exchange_within(
    addr: SocketAddr,
    method: &str,
    path: &str,
    headers: &[(&str, String)],
    body: Vec<u8>,
    max_answer_bytes: usize,
) -> Result<(u16, Vec<u8>), ExchangeError> {
    let protocol = |e: &dyn std::fmt::Display| ExchangeError::Protocol(e.to_string());
    let stream = tokio::time::timeout(CONNECT_TIMEOUT, TcpStream::connect(addr))
        .await
        .map_err(|_| {
            ExchangeError::Connect(std::io::Error::new(
                std::io::ErrorKind::TimedOut,
                format!("no connection within {CONNECT_TIMEOUT:?}"),
            ))
        })?
        .map_err(ExchangeError::Connect)?;
    let (mut sender, connection) = hyper::client::conn::http1::handshake(TokioIo::new(stream))
        .await
        .map_err(|e| protocol(&e))?;
    let driver = tokio::spawn(connection);
    let mut request = hyper::Request::builder()
        .method(method)
        .uri(path)
        .header(hyper::header::CONNECTION, "close");
    for (name, value) in headers {
        request = request.header(*name, value.as_str());
    }
    let request = request
        .body(Full::new(Bytes::from(body)))
        .map_err(|e| protocol(&e))?;
    let answer = sender.send_request(request).await.map_err(|e| {
        if e.is_parse() {
            ExchangeError::Protocol(format!(
                "{addr} does not answer in HTTP ({e}); the admin API's default port is \
                 10810, NBD's 10809"
            ))
        } else {
            ExchangeError::Connect(std::io::Error::other(e))
        }
    })?;
    let status = answer.status().as_u16();
    let body = Limited::new(answer.into_body(), max_answer_bytes)
        .collect()
        .await
        .map_err(|e| match e.downcast_ref::<LengthLimitError>() {
            Some(_) => protocol(&format!("an answer over {max_answer_bytes} bytes")),
            None => protocol(&format!("the answer's body: {e}")),
        })?
        .to_bytes()
        .to_vec();
    driver.abort();
    Ok((status, body))
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    use tokio::net::TcpListener;

    /// A peer that reads a request head and writes `reply` (then closes).
    async fn peer(reply: Vec<u8>) -> SocketAddr {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        tokio::spawn(async move {
            let (mut s, _) = listener.accept().await.unwrap();
            let mut head = Vec::new();
            let mut byte = [0u8; 1];
            while !head.ends_with(b"\r\n\r\n") && s.read(&mut byte).await.unwrap_or(0) == 1 {
                head.push(byte[0]);
            }
            let _ = s.write_all(&reply).await;
        });
        addr
    }

    #[tokio::test]
    async fn lengths_chunks_and_closes_delimit_answers() {
        for (reply, status, body) in [
            (&b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\n[]"[..], 200, &b"[]"[..]),
            (
                b"HTTP/1.1 404 Not Found\r\nTransfer-Encoding: chunked\r\n\r\n3\r\nabc\r\n2\r\nde\r\n0\r\n\r\n",
                404,
                b"abcde",
            ),
            (b"HTTP/1.1 500 Oops\r\nconnection: close\r\n\r\nall of it", 500, b"all of it"),
        ] {
            let addr = peer(reply.to_vec()).await;
            let got = exchange(addr, "GET", "/v1/x", &[], Vec::new()).await.unwrap();
            assert_eq!(got, (status, body.to_vec()));
        }
    }

    #[tokio::test]
    async fn a_peer_that_is_not_http_is_named_so() {
        // What an NBD server sends first.
        let addr = peer(b"NBDMAGICIHAVEOPT\x00\x03".to_vec()).await;
        match exchange(addr, "GET", "/v1/volumes", &[], Vec::new()).await {
            Err(ExchangeError::Protocol(m)) => {
                assert!(m.contains("does not answer in HTTP"), "{m}")
            }
            other => panic!("{other:?}"),
        }
    }

    #[tokio::test]
    async fn an_answer_over_the_bound_is_refused() {
        let mut reply = b"HTTP/1.1 200 OK\r\ncontent-length: 2000\r\n\r\n".to_vec();
        reply.extend_from_slice(&[b'x'; 2000]);
        let addr = peer(reply.clone()).await;
        match exchange_within(addr, "GET", "/", &[], Vec::new(), 1000).await {
            Err(ExchangeError::Protocol(m)) => assert!(m.contains("over 1000 bytes"), "{m}"),
            other => panic!("{other:?}"),
        }
        let addr = peer(reply).await;
        let (_, body) = exchange_within(addr, "GET", "/", &[], Vec::new(), 2000)
            .await
            .unwrap();
        assert_eq!(body.len(), 2000);
    }
}
