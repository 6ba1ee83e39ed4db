//! `sqlx::migrate!` embeds `migrations/` when the crate compiles, and cargo does not know
//! the folder is an input: a new migration alone would leave a binary without it.
fn main() {
    println!("cargo:rerun-if-changed=../migrations");
}
