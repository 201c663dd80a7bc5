//! The training examples' progress bars.

use indicatif::{ProgressBar, ProgressStyle};

/// A progress bar over `steps` training steps (drawn on a terminal only).
pub fn progress(steps: usize, label: &str) -> ProgressBar {
    let bar = ProgressBar::new(steps as u64);
    bar.set_style(
        ProgressStyle::with_template(&format!("{label:>8} {{bar:30}} {{pos}}/{{len}} {{msg}}"))
            .unwrap_or_else(|_| ProgressStyle::default_bar()),
    );
    bar
}
