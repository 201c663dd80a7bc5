//! Compute speed of the strip helpers (`smelt_rt::vmath`): each op mapped over a buffer that
//! stays in L1 (4096 f32s), on one thread, so that arithmetic and not memory sets the pace.
//! Prints ns per element, the median of 15 runs of 2000 maps (range in brackets), for the
//! ISA the helpers chose; `SMELT_CPU=avx2` caps them at AVX2 + FMA.
//!
//! Run: `cargo bench -p smelt-rt --bench strips` (add `-- OP ...` to time some ops only,
//! by their names as printed).

use smelt_rt::vmath::{self, StripOp};
use std::hint::black_box;
use std::time::Instant;

const N: usize = 4096;
const MAPS: usize = 2000;
const RUNS: usize = 15;

fn main() {
    let want: Vec<String> = std::env::args()
        .skip(1)
        .filter(|a| !a.starts_with('-'))
        .collect();
    // values in [-6, 6): both sides of every op's branches, few saturated lanes
    let src: Vec<f32> = (0..N)
        .map(|i| ((i as u32).wrapping_mul(2_654_435_761) >> 8) as f32 / (1 << 24) as f32)
        .map(|u| 12.0 * u - 6.0)
        .collect();
    println!(
        "strip helpers on {}: ns per element, one thread",
        vmath::isa()
    );
    println!("| op | ns/element | range |");
    println!("|---|---|---|");
    let mut buf = src.clone();
    for op in StripOp::ALL {
        let name = format!("{op:?}");
        if !want.is_empty() && !want.contains(&name) {
            continue;
        }
        let mut ns: Vec<f64> = (0..RUNS)
            .map(|_| {
                let t = Instant::now();
                for _ in 0..MAPS {
                    buf.copy_from_slice(&src);
                    vmath::apply(op, black_box(&mut buf));
                }
                t.elapsed().as_secs_f64() * 1e9 / (MAPS * N) as f64
            })
            .collect();
        ns.sort_by(f64::total_cmp);
        println!(
            "| {name} | {:.3} | {:.3}–{:.3} |",
            ns[RUNS / 2],
            ns[0],
            ns[RUNS - 1]
        );
    }
}
