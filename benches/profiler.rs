//! What the profiler costs: per-op time of small eager ops, of a large one and of a
//! compiled call, with the profiler off, on (shapes), and on with memory, the three taking
//! turns over several rounds (median and range of the round medians).
//!
//! Run: `cargo bench --bench profiler`.

#[allow(dead_code)] // shared with the other benches; this one needs only `median_ms`
mod timing;

use smelt::exec::{CompileOptions, CompiledFn};
use smelt::ir::parse_module;
use smelt::profiler::{self, Profiler, ProfilerOptions};
use smelt::{DType, Tensor};
use std::hint::black_box;
use timing::median_ms;

const ROUNDS: usize = 7;

#[derive(Clone, Copy)]
enum Mode {
    Off,
    On,
    OnMemory,
}

impl Mode {
    fn name(self) -> &'static str {
        match self {
            Mode::Off => "off",
            Mode::On => "on",
            Mode::OnMemory => "on + memory",
        }
    }
    /// `f`'s median time in this mode; the session's events are dropped after each round.
    fn time(self, reps: usize, f: &mut impl FnMut()) -> f64 {
        let opts = match self {
            Mode::Off => return median_ms(reps, &mut *f),
            Mode::On => ProfilerOptions::default(),
            Mode::OnMemory => ProfilerOptions::default().profile_memory(true),
        };
        let p = Profiler::start(opts).expect("no other session");
        let t = median_ms(reps, &mut *f);
        drop(black_box(p.stop()));
        t
    }
}

/// Rounds of the three modes in turn; prints one row per mode: median (range) per call.
fn compare(name: &str, calls: usize, reps: usize, mut f: impl FnMut()) {
    let modes = [Mode::Off, Mode::On, Mode::OnMemory];
    let mut t: Vec<Vec<f64>> = vec![Vec::new(); modes.len()];
    for _ in 0..ROUNDS {
        for (i, m) in modes.iter().enumerate() {
            t[i].push(m.time(reps, &mut f) * 1e3 / calls as f64);
        }
    }
    let med = |v: &mut Vec<f64>| {
        v.sort_by(f64::total_cmp);
        (v[v.len() / 2], v[0], v[v.len() - 1])
    };
    let (off, _, _) = med(&mut t[0].clone());
    for (i, m) in modes.iter().enumerate() {
        let (md, lo, hi) = med(&mut t[i]);
        println!(
            "| {name} | {} | {md:.3} µs ({lo:.3}–{hi:.3}) | {:.2} |",
            m.name(),
            md / off
        );
    }
}

fn main() {
    println!(
        "profiler cost, {} rounds, modes in turn; time per call: median of rounds (range); ratio to off",
        ROUNDS
    );
    println!("| workload | profiler | per call | vs off |\n|---|---|---|---|");

    let a = Tensor::rand(&[64], Some(DType::F32)).expect("rand");
    let b = Tensor::rand(&[64], Some(DType::F32)).expect("rand");
    const SMALL: usize = 2000;
    compare("add of 64 floats (eager)", SMALL, 15, || {
        for _ in 0..SMALL {
            drop(black_box(&a).add(black_box(&b)).expect("add"));
        }
    });

    let x = Tensor::rand(&[2048, 2048], Some(DType::F32)).expect("rand");
    compare("relu of 2048² floats (eager)", 1, 15, || {
        drop(black_box(&x).relu().expect("relu"));
    });

    let m = parse_module(
        "graph g(%x: f32[64, 64]) {\n  %r = relu(%x)\n  %y = mul(%r, 0.5)\n  %s = sum(%y, dim=[1])\n  %t = tanh(%s)\n  return %t\n}\n",
        "g",
    )
    .expect("parse");
    let f = CompiledFn::compile(&m.graphs[0], &CompileOptions::default()).expect("compile");
    let xs = [Tensor::rand(&[64, 64], Some(DType::F32)).expect("rand")];
    const CALLS: usize = 500;
    compare("compiled call, 2 kernels on 64²", CALLS, 15, || {
        for _ in 0..CALLS {
            drop(black_box(f.call(&xs).expect("call")));
        }
    });
    assert!(!profiler::enabled());
}
