//! The disk cache of compiled CPU code: a model compiled once loads from it without the
//! passes or Cranelift, in this process and in fresh ones, and runs the same code; a
//! damaged entry is compiled afresh, never run.

mod common;

use common::{assert_bits, inputs_for, temp_dir};
use smelt::exec::{CodeOrigin, CompileOptions, CompiledFn, DiskCache};
use smelt::ir::text::parse_module;

const MODELS: [&str; 4] = [
    "examples/models/mlp_block.smelt",
    "examples/models/attention.smelt",
    "examples/models/layer_norm.smelt",
    "examples/models/softmax.smelt",
];

fn graph(path: &str) -> smelt::ir::Graph {
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR"));
    let text = std::fs::read_to_string(root.join(path)).unwrap();
    parse_module(&text, path).unwrap().graphs.remove(0)
}

#[test]
fn cached_code_gives_the_jits_bits_fused_and_unfused() {
    let dir = temp_dir("same-bits");
    for path in MODELS {
        let g = graph(path);
        for fuse in [true, false] {
            let at = CompileOptions::default()
                .fused(fuse)
                .disk_cache(DiskCache::At(dir.clone()));
            let jit = CompiledFn::compile(&g, &at.clone().disk_cache(DiskCache::Off)).unwrap();
            assert_eq!(jit.code_origin(), CodeOrigin::Jit);
            let stored = CompiledFn::compile(&g, &at).unwrap();
            assert_eq!(stored.code_origin(), CodeOrigin::Compiled, "{path}");
            let loaded = CompiledFn::compile(&g, &at).unwrap();
            assert_eq!(loaded.code_origin(), CodeOrigin::Disk, "{path}");
            assert_eq!(
                loaded.schedule(),
                stored.schedule(),
                "{path}: the same schedule"
            );
            for seed in [1, 2] {
                let inputs = inputs_for(&g, seed);
                let want = jit.call(&inputs).unwrap();
                for f in [&stored, &loaded] {
                    for (a, b) in f.call(&inputs).unwrap().iter().zip(&want) {
                        assert_bits(a, b, path);
                    }
                }
            }
        }
    }
}

/// Graphs that differ only in a constant's elements (the key holds a hash of each
/// constant's bytes, not its text) get entries of their own: each runs with its constant.
#[test]
fn graphs_differing_only_in_a_constant_do_not_share_an_entry() {
    let dir = temp_dir("constants");
    let at = CompileOptions::default().disk_cache(DiskCache::At(dir.clone()));
    let x = smelt::Tensor::from_vec(vec![1.0f32, 2.0, 3.0], &[3]).unwrap();
    for (c, want) in [("0.5", [1.5f32, 2.5, 3.5]), ("-0.5", [0.5, 1.5, 2.5])] {
        let text = format!(
            "graph g(%x: f32[3]) {{\n  %c: f32[3] = constant(dtype=f32, shape=[3], data=[{c}, {c}, {c}])\n  %y = add(%x, %c)\n  return %y\n}}\n"
        );
        let g = parse_module(&text, "g").unwrap().graphs.remove(0);
        let f = CompiledFn::compile(&g, &at).unwrap();
        assert_eq!(f.code_origin(), CodeOrigin::Compiled, "constant {c}");
        let again = CompiledFn::compile(&g, &at).unwrap();
        assert_eq!(again.code_origin(), CodeOrigin::Disk, "constant {c}");
        let y = again.call(std::slice::from_ref(&x)).unwrap();
        assert_eq!(y[0].to_vec::<f32>().unwrap(), want.to_vec(), "constant {c}");
    }
}

#[test]
fn damaged_entries_are_compiled_afresh() {
    let dir = temp_dir("damaged");
    let g = graph("examples/models/mlp_block.smelt");
    let at = CompileOptions::default().disk_cache(DiskCache::At(dir.clone()));
    let first = CompiledFn::compile(&g, &at).unwrap();
    let inputs = inputs_for(&g, 3);
    let want = first.call(&inputs).unwrap();
    let files: Vec<_> = std::fs::read_dir(&dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .collect();
    assert_eq!(files.len(), 1);
    let good = std::fs::read(&files[0]).unwrap();
    let damages: Vec<Vec<u8>> = vec![
        good[..good.len() / 2].to_vec(),
        {
            let mut b = good.clone();
            let n = b.len();
            b[n - 100] ^= 0xff;
            b
        },
        b"not a cache entry".to_vec(),
        Vec::new(),
    ];
    for bad in damages {
        std::fs::write(&files[0], &bad).unwrap();
        let f = CompiledFn::compile(&g, &at).unwrap();
        assert_eq!(f.code_origin(), CodeOrigin::Compiled);
        for (a, b) in f.call(&inputs).unwrap().iter().zip(&want) {
            assert_bits(a, b, "recompiled");
        }
        // and the entry is whole again
        assert_eq!(
            CompiledFn::compile(&g, &at).unwrap().code_origin(),
            CodeOrigin::Disk
        );
    }
}

/// A fresh process loads the model from the cache: `smelt profile` reports where its code
/// came from and that Cranelift compiled no function.
#[test]
fn a_fresh_process_loads_without_cranelift() {
    let dir = temp_dir("fresh");
    let cache = dir.join("cache");
    let run = || {
        let json = dir.join("profile.json");
        let out = std::process::Command::new(env!("CARGO_BIN_EXE_smelt"))
            .args(["profile", "examples/models/mlp_block.smelt", "--json"])
            .arg(&json)
            .current_dir(env!("CARGO_MANIFEST_DIR"))
            .env("SMELT_CACHE_DIR", &cache)
            .output()
            .unwrap();
        assert!(out.status.success(), "{}", common::stderr(&out));
        let v: serde_json::Value =
            serde_json::from_str(&std::fs::read_to_string(&json).unwrap()).unwrap();
        (
            v["code_origin"].as_str().unwrap().to_string(),
            v["cranelift_functions"].as_f64().unwrap(),
            v["max_abs_diff"].as_f64().unwrap(),
        )
    };
    let (origin, functions, diff) = run();
    assert_eq!(origin, "compiled, stored in the disk cache");
    assert!(functions > 0.0);
    assert!(diff < 1e-4);
    let (origin, functions, diff2) = run();
    assert_eq!(origin, "disk cache");
    assert_eq!(functions, 0.0, "a cached model runs no Cranelift");
    assert_eq!(diff, diff2);
}

/// `smelt ARGS` with the disk cache in `cache`, and `SMELT_CACHE_MAX_BYTES=limit` if given.
fn smelt_cached(
    cache: &std::path::Path,
    limit: Option<u64>,
    args: &[&str],
) -> std::process::Command {
    let mut c = std::process::Command::new(env!("CARGO_BIN_EXE_smelt"));
    c.args(args)
        .current_dir(env!("CARGO_MANIFEST_DIR"))
        .env("SMELT_CACHE_DIR", cache)
        .env_remove("SMELT_CACHE_MAX_BYTES");
    if let Some(l) = limit {
        c.env("SMELT_CACHE_MAX_BYTES", l.to_string());
    }
    c
}

#[test]
fn processes_share_whole_entries_and_the_cache_command_shows_evicts_and_clears_them() {
    let dir = temp_dir("processes");
    let cache = dir.join("cache");
    let x = dir.join("x.npy");
    smelt::runtime::npy::write_npy(&x, &smelt::Tensor::randn(&[8, 16], None).unwrap()).unwrap();
    let input = format!("x={}", x.display());
    let run = |out: &str, limit: Option<u64>| {
        let out = dir.join(out).display().to_string();
        let args = [
            "run",
            "examples/models/softmax.smelt",
            "--input",
            &input,
            "--out",
            &out,
        ];
        smelt_cached(&cache, limit, &args)
    };
    // two processes compile the same model into the same entry at once
    let children: Vec<_> = ["a", "b"]
        .iter()
        .map(|o| run(o, None).spawn().unwrap())
        .collect();
    for c in children {
        let out = c.wait_with_output().unwrap();
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
    let read = |o: &str| std::fs::read(dir.join(o).join("out0.npy")).unwrap();
    assert_eq!(read("a"), read("b"));
    let stats = |limit| {
        let out = smelt_cached(&cache, limit, &["cache", "stats"])
            .output()
            .unwrap();
        assert!(out.status.success());
        String::from_utf8_lossy(&out.stdout).into_owned()
    };
    let s = stats(None);
    assert!(s.contains("cpu: 1 entries"), "{s}");
    assert!(s.contains("of at most 1073741824"), "{s}");
    // no writer's temporary file is left behind
    let names: Vec<String> = std::fs::read_dir(cache.join("cpu"))
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    assert!(names.iter().all(|n| n.ends_with(".bin")), "{names:?}");
    // a third process loads the entry and computes the same outputs
    assert!(run("c", None).status().unwrap().success());
    assert_eq!(read("c"), read("a"));
    let out = smelt_cached(&cache, None, &["cache", "clear"])
        .output()
        .unwrap();
    assert!(String::from_utf8_lossy(&out.stdout).contains("removed 1 entries"));
    assert!(stats(None).contains("total: 0 entries"));
    // under a limit smaller than one entry, a write evicts everything, itself included
    assert!(run("d", Some(1)).status().unwrap().success());
    assert_eq!(read("d"), read("a"));
    let s = stats(Some(1));
    assert!(s.contains("total: 0 entries, 0 bytes of at most 1 "), "{s}");
}
