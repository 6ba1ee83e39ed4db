//! The per-call store state: a deny-all WASI context, capped stdio, the log buffer and the
//! resource limiter.
//!
//! A Rust `wasm32-wasip2` component imports about a dozen `wasi:cli`/`wasi:io` interfaces even
//! when it never prints, and CPython's WASI build links `wasi:sockets` and the rest of
//! `wasi:filesystem` whether or not the plugin uses them. Rejecting those would reject every
//! real plugin, so they are linked but given nothing: no preopened directories (so no file
//! can be named), no environment, no arguments, TCP, UDP and name lookup refused with
//! `access-denied` (or a resolver failure) on every call, empty stdin, stdout/stderr that keep
//! only a capped prefix, and clock waits that must end before the call's deadline (`clock`).

use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::time::Instant;

use wasmtime::component::ResourceTable;
use wasmtime_wasi::cli::{IsTerminal, StdoutStream};
use wasmtime_wasi::p2::{OutputStream, Pollable, StreamError, StreamResult};
use wasmtime_wasi::{WasiCtx, WasiCtxBuilder, WasiCtxView, WasiView};

use crate::bindings::{v01, v02};
use crate::clock::GuardedClock;
use crate::limits::{Limiter, Limits};
use crate::report::{LogLevel, LogRecord};

/// Everything a store holds for one call.
pub struct State {
    wasi: WasiCtx,
    table: ResourceTable,
    pub limiter: Limiter,
    pub logs: LogBuffer,
    pub stdout: CappedPipe,
    pub stderr: CappedPipe,
    /// When the call must be over (`Limits::timeout` from the store's creation).
    deadline: Instant,
}

impl State {
    pub fn new(limits: &Limits) -> Self {
        let stdout = CappedPipe::new(limits.max_stdio_bytes);
        let stderr = CappedPipe::new(limits.max_stdio_bytes);
        let wasi = WasiCtxBuilder::new()
            .stdout(stdout.clone())
            .stderr(stderr.clone())
            .allow_tcp(false)
            .allow_udp(false)
            .allow_ip_name_lookup(false)
            .build();
        Self {
            wasi,
            table: ResourceTable::new(),
            limiter: Limiter::new(limits.max_memory_bytes),
            logs: LogBuffer::new(limits.max_log_bytes),
            stdout,
            stderr,
            // A timeout too large to represent is as good as none.
            deadline: Instant::now()
                .checked_add(limits.timeout)
                .unwrap_or_else(|| Instant::now() + std::time::Duration::from_secs(1 << 32)),
        }
    }

    pub fn clock(&mut self) -> GuardedClock<'_> {
        GuardedClock {
            deadline: self.deadline,
            table: &mut self.table,
        }
    }
}

impl WasiView for State {
    fn ctx(&mut self) -> WasiCtxView<'_> {
        WasiCtxView {
            ctx: &mut self.wasi,
            table: &mut self.table,
        }
    }
}

/// Log messages kept for after the call; forwarding them to `tracing` happens outside the
/// store so a plugin can never block on the host's log sink.
#[derive(Debug, Default)]
pub struct LogBuffer {
    cap: usize,
    used: usize,
    pub records: Vec<LogRecord>,
    pub dropped: u64,
}

impl LogBuffer {
    fn new(cap: usize) -> Self {
        Self {
            cap,
            ..Self::default()
        }
    }

    fn push(&mut self, level: LogLevel, message: String) {
        if self.used + message.len() > self.cap {
            self.dropped += 1;
            return;
        }
        self.used += message.len();
        self.records.push(LogRecord { level, message });
    }
}

/// The `log` import of each contract version feeds the same buffer.
macro_rules! log_host {
    ($v:ident) => {
        impl $v::heddle::plugin::log::Host for State {
            fn log(&mut self, level: $v::heddle::plugin::log::Level, message: String) {
                use $v::heddle::plugin::log::Level;
                let level = match level {
                    Level::Trace => LogLevel::Trace,
                    Level::Debug => LogLevel::Debug,
                    Level::Info => LogLevel::Info,
                    Level::Warn => LogLevel::Warn,
                    Level::Error => LogLevel::Error,
                };
                self.logs.push(level, message);
            }
        }
    };
}
log_host!(v01);
log_host!(v02);

/// Keeps the first `cap` bytes written and silently discards the rest, counting them. Failing
/// the write instead would make Rust's `println!` panic, turning chatty plugins into crashing
/// ones.
#[derive(Debug, Clone)]
pub struct CappedPipe {
    inner: Arc<Mutex<Captured>>,
}

#[derive(Debug, Default)]
struct Captured {
    cap: usize,
    kept: Vec<u8>,
    dropped: u64,
}

impl CappedPipe {
    fn new(cap: usize) -> Self {
        Self {
            inner: Arc::new(Mutex::new(Captured {
                cap,
                ..Captured::default()
            })),
        }
    }

    /// What was kept (lossy UTF-8) and how many bytes were dropped.
    pub fn take(&self) -> (String, u64) {
        let mut c = self.inner.lock().unwrap_or_else(|p| p.into_inner());
        (
            String::from_utf8_lossy(&std::mem::take(&mut c.kept)).into_owned(),
            c.dropped,
        )
    }
}

impl IsTerminal for CappedPipe {
    fn is_terminal(&self) -> bool {
        false
    }
}

impl StdoutStream for CappedPipe {
    fn p2_stream(&self) -> Box<dyn OutputStream> {
        Box::new(self.clone())
    }

    fn async_stream(&self) -> Box<dyn tokio::io::AsyncWrite + Send + Sync> {
        Box::new(self.clone())
    }
}

impl CappedPipe {
    fn write_bytes(&self, bytes: &[u8]) {
        let mut c = self.inner.lock().unwrap_or_else(|p| p.into_inner());
        let room = c.cap.saturating_sub(c.kept.len());
        let keep = room.min(bytes.len());
        c.kept.extend_from_slice(&bytes[..keep]);
        c.dropped += (bytes.len() - keep) as u64;
    }
}

/// Plenty for one `println!`; the guest loops when it has more.
const WRITE_BUDGET: usize = 64 << 10;

impl OutputStream for CappedPipe {
    fn write(&mut self, bytes: bytes::Bytes) -> StreamResult<()> {
        if bytes.len() > WRITE_BUDGET {
            return Err(StreamError::Trap(wasmtime::format_err!(
                "write larger than check_write allowed"
            )));
        }
        self.write_bytes(&bytes);
        Ok(())
    }

    fn flush(&mut self) -> StreamResult<()> {
        Ok(())
    }

    fn check_write(&mut self) -> StreamResult<usize> {
        Ok(WRITE_BUDGET)
    }
}

impl Pollable for CappedPipe {
    // Always ready: writes never block.
    fn ready<'a, 'b>(&'a mut self) -> Pin<Box<dyn Future<Output = ()> + Send + 'b>>
    where
        'a: 'b,
    {
        Box::pin(async {})
    }
}

impl tokio::io::AsyncWrite for CappedPipe {
    fn poll_write(
        self: Pin<&mut Self>,
        _cx: &mut std::task::Context<'_>,
        buf: &[u8],
    ) -> std::task::Poll<std::io::Result<usize>> {
        self.write_bytes(buf);
        std::task::Poll::Ready(Ok(buf.len()))
    }

    fn poll_flush(
        self: Pin<&mut Self>,
        _cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<std::io::Result<()>> {
        std::task::Poll::Ready(Ok(()))
    }

    fn poll_shutdown(
        self: Pin<&mut Self>,
        _cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<std::io::Result<()>> {
        std::task::Poll::Ready(Ok(()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn capped_pipe_keeps_a_prefix_and_counts_the_rest() {
        let mut p = CappedPipe::new(5);
        p.write(bytes::Bytes::from_static(b"abc")).unwrap();
        p.write(bytes::Bytes::from_static(b"defgh")).unwrap();
        assert_eq!(p.take(), ("abcde".to_string(), 3));
    }

    #[test]
    fn log_buffer_drops_past_its_cap() {
        let mut b = LogBuffer::new(10);
        b.push(LogLevel::Info, "12345".into());
        b.push(LogLevel::Info, "123456".into());
        b.push(LogLevel::Warn, "12345".into());
        assert_eq!(b.records.len(), 2);
        assert_eq!(b.dropped, 1);
    }
}
