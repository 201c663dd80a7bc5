//! `SMELT_MAX_ALLOC_BYTES`: a tensor that would take the host memory tensors hold past the
//! limit is a clean `OutOfMemory` error naming the limit, not an abort (each case runs the
//! `smelt` binary, since the limit is read once per process).

mod common;

use common::{smelt_in, stderr, temp_dir};

fn run_with_limit(dir: &std::path::Path, model: &str, limit: &str) -> std::process::Output {
    std::fs::write(dir.join("g.smelt"), model).unwrap();
    let mut c = std::process::Command::new(env!("CARGO_BIN_EXE_smelt"));
    c.args(["run", "g.smelt", "--out", "o", "--backend", "interp"])
        .env("SMELT_MAX_ALLOC_BYTES", limit)
        .current_dir(dir);
    c.output().unwrap()
}

#[test]
fn a_tensor_past_the_limit_is_an_error_naming_it() {
    let dir = temp_dir("limit");
    // 4 MB of f32 against a 1 MB limit
    let big = "graph g() {\n  %x = full(size=[1000000], fill_value=1.0)\n  %s = sum(%x)\n  return %s\n}\n";
    let o = run_with_limit(&dir, big, "1000000");
    assert_eq!(o.status.code(), Some(1), "{}", stderr(&o));
    let e = stderr(&o);
    assert!(
        e.starts_with("error: DefaultCPUAllocator: can't allocate memory"),
        "{e}"
    );
    assert!(
        e.contains("passes the limit of 1000000 bytes (SMELT_MAX_ALLOC_BYTES)"),
        "{e}"
    );
    // the same graph under a limit it fits, and with the limit off
    for limit in ["100000000", "off"] {
        let o = run_with_limit(&dir, big, limit);
        assert!(o.status.success(), "{limit}: {}", stderr(&o));
        let s = smelt::runtime::npy::read_npy(dir.join("o/out0.npy")).unwrap();
        assert_eq!(s.try_to_f64_vec().unwrap(), vec![1e6]);
    }
    // and without the variable, the default (a share of physical memory) lets it run
    let o = smelt_in(
        &dir,
        &["run", "g.smelt", "--out", "o", "--backend", "interp"],
    );
    assert!(o.status.success(), "{}", stderr(&o));
}
