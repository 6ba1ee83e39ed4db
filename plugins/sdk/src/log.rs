//! Logging through the host's non-blocking `log` import. Natively (unit tests) messages go to
//! stderr instead, because the import only exists inside a Heddle host.

#[cfg(target_arch = "wasm32")]
fn emit(level: crate::bindings::heddle::plugin::log::Level, message: &str) {
    crate::bindings::heddle::plugin::log::log(level, message);
}

macro_rules! level_fn {
    ($name:ident, $variant:ident) => {
        pub fn $name(message: &str) {
            #[cfg(target_arch = "wasm32")]
            emit(
                crate::bindings::heddle::plugin::log::Level::$variant,
                message,
            );
            #[cfg(not(target_arch = "wasm32"))]
            eprintln!("[{}] {}", stringify!($name), message);
        }
    };
}

level_fn!(trace, Trace);
level_fn!(debug, Debug);
level_fn!(info, Info);
level_fn!(warn, Warn);
level_fn!(error, Error);
