//! An async NBD client over tokio TCP built on the weir-nbd state machines, for
//! the load generator and the tests: pipeline any number of requests through
//! [`NbdClient::session`], then collect [`Completion`]s in completion order.

use std::collections::HashMap;
use std::net::{IpAddr, SocketAddr};

use anyhow::{Context as _, bail};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpSocket, TcpStream};
use weir_nbd::{
    ClientConfig, ClientExport, ClientHandshake, ClientOutcome, ClientSession, Completion,
    ExportListing, NbdError, ReplyData,
};

pub struct NbdClient {
    stream: TcpStream,
    session: ClientSession,
    buf: Vec<u8>,
    parked: HashMap<u64, Completion>,
}

async fn handshake(
    addr: SocketAddr,
    from: Option<IpAddr>,
    config: ClientConfig,
) -> anyhow::Result<(TcpStream, ClientOutcome, Vec<u8>)> {
    let mut stream = match from {
        None => TcpStream::connect(addr).await,
        Some(local) => {
            let socket = if local.is_ipv4() {
                TcpSocket::new_v4()?
            } else {
                TcpSocket::new_v6()?
            };
            socket
                .bind(SocketAddr::new(local, 0))
                .with_context(|| format!("binding {local}"))?;
            socket.connect(addr).await
        }
    }
    .with_context(|| format!("connecting to {addr}"))?;
    stream.set_nodelay(true)?;
    let mut hs = ClientHandshake::new(config);
    let mut buf = vec![0u8; 64 * 1024];
    loop {
        let n = stream.read(&mut buf).await?;
        if n == 0 {
            bail!("server closed the connection during the handshake");
        }
        let outcome = hs.input(&buf[..n])?;
        let out = hs.take_output();
        if !out.is_empty() {
            stream.write_all(&out).await?;
        }
        if let Some(o) = outcome {
            return Ok((stream, o, hs.take_leftover()));
        }
    }
}

impl NbdClient {
    /// Connects and opens `config.export_name` (fixed newstyle, `NBD_OPT_GO`).
    pub async fn connect(
        addr: SocketAddr,
        config: ClientConfig,
    ) -> anyhow::Result<(NbdClient, ClientExport)> {
        Self::connect_from(None, addr, config).await
    }

    /// As [`NbdClient::connect`], from a chosen local address (e.g. `127.0.0.2`
    /// to act as a second host on loopback).
    pub async fn connect_from(
        from: Option<IpAddr>,
        addr: SocketAddr,
        config: ClientConfig,
    ) -> anyhow::Result<(NbdClient, ClientExport)> {
        let (stream, outcome, leftover) = handshake(addr, from, config).await?;
        let ClientOutcome::Connected(export) = outcome else {
            bail!("handshake ended without an export")
        };
        let mut session = ClientSession::new(export.export_info());
        session.input(&leftover)?;
        Ok((
            NbdClient {
                stream,
                session,
                buf: vec![0u8; 256 * 1024],
                parked: HashMap::new(),
            },
            export,
        ))
    }

    /// The exports this host may see (`NBD_OPT_LIST`).
    pub async fn list(addr: SocketAddr) -> anyhow::Result<Vec<ExportListing>> {
        let (mut stream, outcome, _) = handshake(addr, None, ClientConfig::list()).await?;
        let _ = stream.shutdown().await;
        match outcome {
            ClientOutcome::Listed(l) => Ok(l),
            other => bail!("unexpected handshake outcome {other:?}"),
        }
    }

    /// Queue requests here; they are sent by the next `send`/`next_completion`.
    pub fn session(&mut self) -> &mut ClientSession {
        &mut self.session
    }

    /// Sends every queued request.
    pub async fn send(&mut self) -> anyhow::Result<()> {
        let out = self.session.take_output();
        if !out.is_empty() {
            self.stream.write_all(&out).await?;
        }
        Ok(())
    }

    /// Sends queued requests, then waits for the next finished one.
    pub async fn next_completion(&mut self) -> anyhow::Result<Completion> {
        self.send().await?;
        loop {
            if let Some(c) = self
                .parked
                .keys()
                .next()
                .copied()
                .and_then(|h| self.parked.remove(&h))
            {
                return Ok(c);
            }
            if let Some(c) = self.session.poll_completion() {
                return Ok(c);
            }
            let n = self.stream.read(&mut self.buf).await?;
            if n == 0 {
                bail!(
                    "server closed the connection with {} requests in flight",
                    self.session.in_flight()
                );
            }
            self.session.input(&self.buf[..n])?;
        }
    }

    /// Waits for the request `handle` (other completions are kept for later).
    pub async fn wait(&mut self, handle: u64) -> anyhow::Result<Result<ReplyData, NbdError>> {
        if let Some(c) = self.parked.remove(&handle) {
            return Ok(c.result);
        }
        self.send().await?;
        loop {
            while let Some(c) = self.session.poll_completion() {
                if c.handle == handle {
                    return Ok(c.result);
                }
                self.parked.insert(c.handle, c);
            }
            let n = self.stream.read(&mut self.buf).await?;
            if n == 0 {
                bail!("server closed the connection while waiting for request {handle}");
            }
            self.session.input(&self.buf[..n])?;
        }
    }

    pub async fn read(
        &mut self,
        offset: u64,
        length: u32,
    ) -> anyhow::Result<Result<Vec<u8>, NbdError>> {
        let h = self.session.read(offset, length);
        Ok(self.wait(h).await?.map(|d| match d {
            ReplyData::Read(v) => v,
            _ => Vec::new(),
        }))
    }

    pub async fn write(
        &mut self,
        offset: u64,
        data: &[u8],
        fua: bool,
    ) -> anyhow::Result<Result<(), NbdError>> {
        let h = self.session.write(offset, data, fua);
        Ok(self.wait(h).await?.map(|_| ()))
    }

    pub async fn flush(&mut self) -> anyhow::Result<Result<(), NbdError>> {
        let h = self.session.flush();
        Ok(self.wait(h).await?.map(|_| ()))
    }

    /// Soft disconnect (`NBD_CMD_DISC`), then waits for the server to close.
    pub async fn disconnect(mut self) -> anyhow::Result<()> {
        self.session.disconnect();
        self.send().await?;
        let mut rest = Vec::new();
        let _ = self.stream.read_to_end(&mut rest).await;
        Ok(())
    }
}
