//! What the training examples' `--profile DIR` does: a few eager and compiled steps
//! recorded with `smelt::profiler`, their tables printed, a trace and a report written.

use smelt::Result;
use smelt::profiler::{self, ProfilerOptions, SortBy};
use std::path::{Path, PathBuf};

/// The directory given with `--profile DIR`, if any.
pub fn profile_dir() -> Result<Option<PathBuf>> {
    let args: Vec<String> = std::env::args().collect();
    match args.iter().position(|a| a == "--profile") {
        None => Ok(None),
        Some(i) => match args.get(i + 1) {
            Some(d) => Ok(Some(d.into())),
            None => Err(smelt::Error::Value("--profile needs a directory".into())),
        },
    }
}

/// Records `steps` calls of `eager_step` and of `compiled_step` (each inside an "eager
/// step"/"compiled step" range, with memory), prints both tables and writes
/// `dir/trace.json` and `dir/report.html`.
pub fn profile_training(
    dir: &Path,
    title: &str,
    steps: usize,
    mut eager_step: impl FnMut(usize) -> Result<()>,
    mut compiled_step: impl FnMut(usize) -> Result<()>,
) -> Result<()> {
    let opts = ProfilerOptions::default().profile_memory(true);
    let record = |label: &str, f: &mut dyn FnMut(usize) -> Result<()>| {
        let (r, prof) = profiler::profile(opts.clone(), || -> Result<()> {
            for i in 0..steps {
                let _s = profiler::record_function(label);
                f(i)?;
            }
            Ok(())
        })?;
        r.map(|()| prof)
    };
    let eager = record("eager step", &mut eager_step)?;
    let compiled = record("compiled step", &mut compiled_step)?;
    for (name, p) in [("eager", &eager), ("compiled", &compiled)] {
        println!("\n{name}, {steps} steps:");
        print!("{}", p.key_averages().table(SortBy::SelfTime, Some(12)));
    }
    let (trace, report) =
        profiler::export_dir(dir, title, &[("eager", &eager), ("compiled", &compiled)])?;
    println!("\nwrote {} and {}", trace.display(), report.display());
    Ok(())
}
