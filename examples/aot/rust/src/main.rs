//! Runs two models compiled ahead of time (by `build.rs`) as typed Rust functions, and prints
//! their outputs the way `examples/aot/c/main.c` does, on the same inputs: input j holds
//! ((7 i + 3 j) mod 17 - 8) / 8 at element i.

include!(concat!(env!("OUT_DIR"), "/mlp.rs"));
include!(concat!(env!("OUT_DIR"), "/attention.rs"));

/// Input `j` of `N` elements.
fn input<const N: usize>(j: usize) -> Box<[f32; N]> {
    let v: Vec<f32> = (0..N)
        .map(|i| ((7 * i + 3 * j) % 17) as f32 / 8.0 - 1.0)
        .collect();
    v.into_boxed_slice().try_into().expect("N elements")
}

fn print(model: &str, output: &str, y: &[f32]) {
    let values: Vec<String> = y.iter().map(|v| format!("{v:.6}")).collect();
    println!("{model} {output}: {}", values.join(" "));
}

fn main() -> Result<(), smelt_rt::model::AotError> {
    let y = mlp(&input(0), &input(1), &input(2), &input(3), &input(4))?;
    print("mlp", "y", &y[..]);
    let mut scratch = vec![0u128; ATTENTION_SCRATCH_BYTES.div_ceil(16)];
    let out = attention_with_scratch(&input(0), &input(1), &input(2), &mut scratch)?;
    print("attention", "out", &out[..]);
    Ok(())
}
