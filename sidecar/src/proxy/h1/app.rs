//! The fast path's connection to the app: one per client connection, kept alive between its requests,
//! opened on first use and again whenever the app closed it.

use std::io;

use bytes::BytesMut;
use http::uri::Authority;
use tokio::net::TcpStream;

use crate::proxy::app_connection::{AppError, connect_tcp};

/// Read buffer a fresh connection starts with.
pub const BUFFER_INITIAL: usize = 4 * 1024;

/// A kept-alive HTTP/1.1 connection to the app.
#[derive(Debug)]
pub struct App {
    /// The socket.
    pub io: TcpStream,
    /// Bytes read from the app and not yet forwarded.
    pub buf: BytesMut,
    /// Whether it carried an exchange before (a request sent on it may meet a close the app sent while
    /// it was idle).
    pub reused: bool,
    authority: Authority,
}

impl App {
    /// Connects to the app at `authority`.
    pub async fn connect(authority: &Authority) -> Result<Self, AppError> {
        Ok(Self {
            io: connect_tcp(authority).await?,
            buf: BytesMut::with_capacity(BUFFER_INITIAL),
            reused: false,
            authority: authority.clone(),
        })
    }

    /// Whether this connection goes to `authority` (a reload may have moved the app).
    pub fn is_for(&self, authority: &Authority) -> bool {
        self.authority == *authority
    }

    /// Whether the app closed the connection, or sent bytes nobody asked for, while it was idle. Costs
    /// no system call unless the socket became readable since it was last read to exhaustion.
    pub fn closed_while_idle(&mut self) -> bool {
        let mut probe = [0u8; 1];
        !matches!(self.io.try_read(&mut probe), Err(e) if e.kind() == io::ErrorKind::WouldBlock)
    }
}
