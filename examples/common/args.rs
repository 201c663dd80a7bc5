//! The command-line flags the training examples share.

/// The number given with `--steps N`, else `default`.
pub fn steps_arg(default: usize) -> smelt::Result<usize> {
    let args: Vec<String> = std::env::args().collect();
    match args.iter().position(|a| a == "--steps") {
        None => Ok(default),
        Some(i) => args
            .get(i + 1)
            .and_then(|n| n.parse().ok())
            .ok_or_else(|| smelt::Error::Value("--steps needs a number".into())),
    }
}
