//! `smelt cache stats` and `smelt cache clear`: what the disk cache of compiled code holds
//! (per kind, against its size limit), and emptying it.

use crate::Result;
use crate::device::cache;
use std::path::Path;

/// Arguments of `smelt cache`.
#[derive(clap::Args, Debug)]
pub struct CacheArgs {
    /// What to do.
    #[command(subcommand)]
    pub action: CacheAction,
}

/// The actions of `smelt cache`.
#[derive(clap::Subcommand, Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum CacheAction {
    /// Print the cache's folder, its entries and bytes per kind, and its size limit.
    Stats,
    /// Remove every entry.
    Clear,
}

/// Runs `smelt cache`.
pub fn cache(a: &CacheArgs) -> Result<()> {
    let Some(root) = cache::root() else {
        println!("the disk cache is off (SMELT_CACHE_DIR=off, or no home folder)");
        return Ok(());
    };
    match a.action {
        CacheAction::Stats => print!("{}", report(&root, cache::max_bytes())),
        CacheAction::Clear => {
            let n = cache::clear(&root);
            println!("removed {n} entries from {}", root.display());
        }
    }
    Ok(())
}

/// The text of `smelt cache stats` for the cache in `root`.
fn report(root: &Path, limit: u64) -> String {
    let mut out = format!("cache: {}\n", root.display());
    for kind in ["cpu", "cuda"] {
        let s = cache::stats(&root.join(kind));
        out.push_str(&format!(
            "  {kind}: {} entries, {} bytes\n",
            s.entries, s.bytes
        ));
    }
    let all = cache::stats(root);
    out.push_str(&format!(
        "  total: {} entries, {} bytes of at most {limit} (SMELT_CACHE_MAX_BYTES)\n",
        all.entries, all.bytes
    ));
    out
}
