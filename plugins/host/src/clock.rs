//! `wasi:clocks/monotonic-clock` for guests: waits that end by the call's deadline, and none
//! that end after it.
//!
//! Fuel and the epoch deadline only stop WebAssembly code. A clock subscription is waited on
//! in host code (`wasi:io/poll`'s `poll` and `pollable.block`), so with the stock
//! implementation `std::thread::sleep` or Python's `time.sleep` of an hour held the calling
//! thread for an hour, out of reach of every limit. Here a subscription that would end after
//! the call's deadline traps at once, as [`WaitDenied`], and is reported as a timeout; shorter
//! ones sleep as usual. Clocks are the only pollables a guest can make wait: stdin is empty,
//! stdout and stderr are always writable, nothing is preopened, and sockets cannot be created.

use std::sync::OnceLock;
use std::time::{Duration, Instant};

use wasmtime::component::{HasData, Linker, Resource, ResourceTable};
use wasmtime_wasi::p2::bindings::clocks::monotonic_clock;
use wasmtime_wasi::p2::{DynPollable, Pollable, subscribe};

/// The trap raised when a guest asks to wait past its deadline.
#[derive(Debug, thiserror::Error)]
#[error("plugin asked to wait {wait:?} on a clock with {remaining:?} left before its deadline")]
pub struct WaitDenied {
    pub wait: Duration,
    pub remaining: Duration,
}

/// Replaces the monotonic clock `wasmtime_wasi` linked (the linker must allow shadowing);
/// `view` gives a store's [`GuardedClock`].
pub fn add_to_linker<T: Send + 'static>(
    linker: &mut Linker<T>,
    view: fn(&mut T) -> GuardedClock<'_>,
) -> wasmtime::Result<()> {
    monotonic_clock::add_to_linker::<T, GuardedClocks>(linker, view)
}

struct GuardedClocks;

impl HasData for GuardedClocks {
    type Data<'a> = GuardedClock<'a>;
}

/// A store's view for the clock: when its call must end, and its resource table.
pub struct GuardedClock<'a> {
    pub deadline: Instant,
    pub table: &'a mut ResourceTable,
}

/// Every guest reads the same monotonic clock, counted from the first time one asked.
fn origin() -> Instant {
    static ORIGIN: OnceLock<Instant> = OnceLock::new();
    *ORIGIN.get_or_init(Instant::now)
}

fn nanos(d: Duration) -> u64 {
    d.as_nanos().try_into().unwrap_or(u64::MAX)
}

impl GuardedClock<'_> {
    fn subscribe_for(&mut self, wait: Duration) -> wasmtime::Result<Resource<DynPollable>> {
        let now = Instant::now();
        let remaining = self.deadline.saturating_duration_since(now);
        if wait > remaining {
            return Err(WaitDenied { wait, remaining }.into());
        }
        let sleep = if wait.is_zero() {
            Sleep::Now { yielded: false }
        } else {
            Sleep::Until(tokio::time::Instant::from_std(now + wait))
        };
        let resource = self.table.push(sleep)?;
        subscribe(self.table, resource)
    }
}

impl monotonic_clock::Host for GuardedClock<'_> {
    fn now(&mut self) -> wasmtime::Result<monotonic_clock::Instant> {
        Ok(nanos(origin().elapsed()))
    }

    fn resolution(&mut self) -> wasmtime::Result<monotonic_clock::Instant> {
        Ok(1)
    }

    fn subscribe_instant(
        &mut self,
        when: monotonic_clock::Instant,
    ) -> wasmtime::Result<Resource<DynPollable>> {
        let now = nanos(origin().elapsed());
        self.subscribe_for(Duration::from_nanos(when.saturating_sub(now)))
    }

    fn subscribe_duration(
        &mut self,
        duration: monotonic_clock::Duration,
    ) -> wasmtime::Result<Resource<DynPollable>> {
        self.subscribe_for(Duration::from_nanos(duration))
    }
}

/// A clock subscription that ends before the deadline.
enum Sleep {
    /// Already due; yields once so a guest polling in a loop does not starve the runtime.
    Now {
        yielded: bool,
    },
    Until(tokio::time::Instant),
}

#[wasmtime_wasi::async_trait]
impl Pollable for Sleep {
    async fn ready(&mut self) {
        match self {
            Sleep::Now { yielded: true } => {}
            Sleep::Now { yielded } => {
                *yielded = true;
                tokio::task::yield_now().await
            }
            Sleep::Until(when) => tokio::time::sleep_until(*when).await,
        }
    }
}
