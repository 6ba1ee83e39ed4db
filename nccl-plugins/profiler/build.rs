//! The plugin's writer thread and exit handler live in the library's code. NCCL dlcloses
//! its profiler plugin when the last communicator is destroyed and may load it again for
//! the next one; `-z nodelete` keeps the code (and the aggregates, and the spool file's
//! sequence) mapped across that, so nothing can ever run from an unmapped library.
fn main() {
    println!("cargo:rustc-cdylib-link-arg=-Wl,-z,nodelete");
}
