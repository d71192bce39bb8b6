//! Links the `hotloop` binary with `hot-text.ld`, which gathers the
//! functions connections run through into one stretch of code ahead of the
//! rest (see that file). The script adds one output section to the default
//! layout (`INSERT BEFORE .text`), which GNU ld and lld (Rust's linker on
//! x86_64 Linux) accept and gold and mold do not: it is passed on Linux
//! with the default linker only, and `HOTLOOP_HOT_TEXT=0` leaves it out.

use std::env;
use std::path::Path;

fn main() {
    println!("cargo:rerun-if-changed=hot-text.ld");
    println!("cargo:rerun-if-env-changed=HOTLOOP_HOT_TEXT");
    let linux = env::var("CARGO_CFG_TARGET_OS").is_ok_and(|os| os == "linux");
    let wanted = env::var("HOTLOOP_HOT_TEXT").map_or(true, |v| v != "0");
    // A linker chosen by configuration, or by flags, may not read the script.
    let own_linker = env::var_os("RUSTC_LINKER").is_some()
        || env::var("CARGO_ENCODED_RUSTFLAGS")
            .is_ok_and(|f| f.contains("fuse-ld") || f.contains("linker"));
    if linux && wanted && !own_linker {
        let dir = env::var("CARGO_MANIFEST_DIR").expect("cargo sets CARGO_MANIFEST_DIR");
        let script = Path::new(&dir).join("hot-text.ld");
        println!("cargo:rustc-link-arg-bins=-Wl,-T,{}", script.display());
    }
}
