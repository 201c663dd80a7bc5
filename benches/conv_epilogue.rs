//! A convolution's epilogue (bias, residual add, relu) run inside it, tile by tile, against
//! the same schedule with the epilogue as a step of its own
//! (`CompileOptions::conv_epilogues`), at three ResNet stage sizes, NCHW and channels_last,
//! the two taking turns call by call. Prints the median and range of the calls.
//!
//! Run: `cargo bench --bench conv_epilogue`.

#[allow(dead_code)] // shared with the other benches; this one needs only `median_ms`
mod timing;

use smelt::exec::{CompileOptions, CompiledFn};
use smelt::ir::parse_module;
use smelt::runtime::MemoryFormat;
use smelt::{DType, Generator, Tensor};

const ROUNDS: usize = 9;

fn main() {
    println!(
        "conv3x3 + bias + residual add + relu, {} threads; median of {ROUNDS} calls each (range), ms",
        rayon::current_num_threads()
    );
    println!("| x | layout | epilogue in the convolution | epilogue apart | apart / in |");
    println!("|---|---|---|---|---|");
    for (n, c, hw) in [(16usize, 64usize, 112usize), (32, 64, 56), (32, 128, 28)] {
        let text = format!(
            "graph e(%x: f32[{n},{c},{hw},{hw}], %w: f32[{c},{c},3,3], %b: f32[{c}], %r: f32[{n},{c},{hw},{hw}]) {{
  %k = conv2d(%x, %w, %b, padding=1)
  %a = add(%k, %r)
  %y = relu(%a)
  return %y
}}
"
        );
        let m = parse_module(&text, "e").unwrap();
        let g = &m.graphs[0];
        let mut rng = Generator::new(1);
        let ins: Vec<Tensor> = g
            .inputs()
            .iter()
            .map(|&v| Tensor::randn_with(&g.node(v).ty.shape, Some(DType::F32), &mut rng).unwrap())
            .collect();
        for cl in [false, true] {
            let mut args = ins.clone();
            let mut opts = CompileOptions::default();
            if cl {
                for i in [0, 3] {
                    args[i] = ins[i].to_memory_format(MemoryFormat::ChannelsLast).unwrap();
                }
                opts = opts.channels_last(&["x", "r"]);
            }
            let fs: Vec<CompiledFn> = [true, false]
                .iter()
                .map(|&nest| CompiledFn::compile(g, &opts.clone().conv_epilogues(nest)).unwrap())
                .collect();
            assert_eq!(fs[0].epilogues_in_convolutions(), 1);
            let mut t = [Vec::new(), Vec::new()];
            for _ in 0..ROUNDS {
                for (j, f) in fs.iter().enumerate() {
                    t[j].push(timing::median_ms(1, || drop(f.call(&args).unwrap())));
                }
            }
            for v in &mut t {
                v.sort_by(f64::total_cmp);
            }
            let cell =
                |v: &[f64]| format!("{:.1} ({:.1}–{:.1})", v[ROUNDS / 2], v[0], v[ROUNDS - 1]);
            println!(
                "| [{n},{c},{hw},{hw}] | {} | {} | {} | {:.3} |",
                if cl { "channels_last" } else { "NCHW" },
                cell(&t[0]),
                cell(&t[1]),
                t[1][ROUNDS / 2] / t[0][ROUNDS / 2]
            );
        }
    }
}
