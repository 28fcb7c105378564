//! The checked-in XDP object must be what bpf/build.sh makes of bpf/fulcrum_xdp.c, byte for
//! byte: `cargo build` embeds the object without a C compiler, and this test (run by the test
//! command, which installs clang) keeps it from drifting from the source.

use std::path::Path;
use std::process::Command;

#[test]
fn checked_in_object_matches_the_source() {
    let crate_dir = Path::new(env!("CARGO_MANIFEST_DIR"));
    let out_dir = tempfile::tempdir().expect("tempdir");
    let out = out_dir.path().join("fulcrum_xdp.o");
    let status = Command::new(crate_dir.join("bpf/build.sh"))
        .arg(&out)
        .status()
        .expect("run bpf/build.sh (needs clang and libbpf-dev, see scripts/test-packages)");
    assert!(status.success(), "bpf/build.sh failed");
    let built = std::fs::read(&out).expect("read the rebuilt object");
    let clang = Command::new("clang")
        .arg("--version")
        .output()
        .map(|o| {
            String::from_utf8_lossy(&o.stdout)
                .lines()
                .next()
                .unwrap_or("")
                .to_string()
        })
        .unwrap_or_default();
    assert!(
        built == fulcrum_xdp::object(),
        "bpf/fulcrum_xdp.o is stale or was built by another compiler ({clang}): \
         run crates/fulcrum-xdp/bpf/build.sh and commit the object"
    );
}
