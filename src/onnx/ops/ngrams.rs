//! `TfIdfVectorizer` over integer tokens: the count of each pool n-gram in each row, built
//! from comparisons of shifted slices of the input with the pool, so nothing depends on the
//! tokens' values at import.
//!
//! An n-gram of length `n` at skip distance `d` starts at any `i` with `i + (n-1)·d` inside
//! the row and reads tokens `i, i+d, ..., i+(n-1)·d`. As the ONNX reference counts them,
//! 1-grams are read at distance 1 only, longer ones at every distance from 1 to
//! `max_skip_count + 1`.

use super::{list, one};
use crate::ir::attrs::Attr;
use crate::ir::graph::ValueId;
use crate::onnx::import::{Cx, Val};
use crate::{DType, Result, Tensor, bail};

/// The pool's n-grams of one length: their tokens, row by row, and their output columns.
struct Level {
    n: usize,
    tokens: Vec<Vec<i64>>,
    columns: Vec<usize>,
}

/// The levels of `pool` that `ngram_counts` delimits, with lengths in `[min, max]`;
/// n-gram `g` of the whole pool (in order) goes to column `indexes[g]`.
fn levels(
    pool: &[i64],
    counts: &[i64],
    indexes: &[i64],
    (min, max): (usize, usize),
) -> Result<Vec<Level>> {
    let mut out = Vec::new();
    let mut g = 0;
    for (k, &start) in counts.iter().enumerate() {
        let n = k + 1;
        let end = counts.get(k + 1).copied().unwrap_or(pool.len() as i64);
        if start < 0 || end < start || end as usize > pool.len() {
            bail!(
                Value,
                "ngram_counts {counts:?} do not delimit a pool of {}",
                pool.len()
            );
        }
        let items = &pool[start as usize..end as usize];
        let grams = items.len() / n;
        if (min..=max).contains(&n) && grams > 0 {
            let mut level = Level {
                n,
                tokens: Vec::new(),
                columns: Vec::new(),
            };
            for (j, gram) in items.chunks_exact(n).enumerate() {
                let Some(&col) = indexes.get(g + j) else {
                    bail!(Value, "ngram_indexes has no entry for n-gram {}", g + j);
                };
                if col < 0 {
                    bail!(Value, "ngram_indexes holds the negative column {col}");
                }
                level.tokens.push(gram.to_vec());
                level.columns.push(col as usize);
            }
            out.push(level);
        }
        g += grams;
    }
    Ok(out)
}

pub fn tf_idf_vectorizer(cx: &mut Cx) -> Result<Vec<Val>> {
    let x = cx.x(0)?;
    if cx.attr("pool_strings").is_some() {
        bail!(
            Unsupported,
            "string pools are not supported (smelt has no string tensors)"
        );
    }
    let Some(pool) = cx.ints("pool_int64s")? else {
        bail!(Value, "attribute 'pool_int64s' is required");
    };
    let counts = cx.ints("ngram_counts")?.unwrap_or_default();
    let indexes = cx.ints("ngram_indexes")?.unwrap_or_default();
    let min = cx.int("min_gram_length", 1)?;
    let max = cx.int("max_gram_length", 1)?;
    let skips = cx.int("max_skip_count", 0)?;
    if min < 1 || max < min || skips < 0 {
        bail!(
            Value,
            "gram lengths {min}..={max} and skip count {skips} are not valid"
        );
    }
    let mode = cx.string("mode")?.unwrap_or_else(|| "TF".into());
    let Some(&last) = indexes.iter().max() else {
        bail!(Value, "ngram_indexes is empty");
    };
    let width = last as usize + 1;
    let weights = cx.floats("weights")?;
    if weights.as_ref().is_some_and(|w| w.len() < width) {
        bail!(Value, "weights has fewer than the {width} output columns");
    }
    let levels = levels(&pool, &counts, &indexes, (min as usize, max as usize))?;

    let shape = cx.shape(x);
    let (rows, c) = match shape.as_slice() {
        [] => (None, 1),
        [c] => (None, *c),
        [b, c] => (Some(*b), *c),
        _ => bail!(Value, "the input must be 1-D or 2-D, got {shape:?}"),
    };
    if cx.dtype(x).is_float() || cx.dtype(x) == DType::Bool {
        bail!(DType, "the input must hold integers, got {}", cx.dtype(x));
    }
    let b = rows.unwrap_or(1);
    let x = super::elementwise::cast_to(cx, x, DType::I64)?;
    let x = cx.call(
        "reshape",
        &[Some(x)],
        &[("shape", list(&[b as i64, c as i64]))],
    )?;
    let mut total: Option<ValueId> = None;
    for level in &levels {
        let n = level.n;
        let distances = if n == 1 { 1 } else { skips as usize + 1 };
        let mut found: Option<ValueId> = None;
        for d in 1..=distances {
            let reach = (n - 1) * d;
            if reach >= c {
                continue;
            }
            let len = c - reach;
            let mut all: Option<ValueId> = None;
            for j in 0..n {
                let at = (j * d) as i64;
                let slice = cx.call(
                    "narrow",
                    &[Some(x)],
                    &[
                        ("dim", Attr::Int(1)),
                        ("start", Attr::Int(at)),
                        ("length", Attr::Int(len as i64)),
                    ],
                )?;
                let slice = cx.call("unsqueeze", &[Some(slice)], &[("dim", Attr::Int(2))])?;
                let want: Vec<i64> = level.tokens.iter().map(|t| t[j]).collect();
                let want = cx.tensor(&Tensor::from_vec(want, &[level.tokens.len()])?)?;
                let eq = cx.call("eq", &[Some(slice), Some(want)], &[])?;
                all = Some(match all {
                    Some(a) => cx.call("logical_and", &[Some(a), Some(eq)], &[])?,
                    None => eq,
                });
            }
            let hits = super::elementwise::cast_to(cx, all.expect("n >= 1"), DType::F32)?;
            let per_gram = cx.call(
                "sum",
                &[Some(hits)],
                &[("dim", list(&[1])), ("keepdim", Attr::Bool(false))],
            )?;
            found = Some(match found {
                Some(f) => cx.call("add", &[Some(f), Some(per_gram)], &[])?,
                None => per_gram,
            });
        }
        let Some(found) = found else { continue };
        // each n-gram's count to its column: a product with a 0/1 matrix, exact for counts
        let grams = level.tokens.len();
        let mut place = vec![0f32; grams * width];
        for (g, &col) in level.columns.iter().enumerate() {
            place[g * width + col] = 1.0;
        }
        let place = cx.tensor(&Tensor::from_vec(place, &[grams, width])?)?;
        let y = cx.call("matmul", &[Some(found), Some(place)], &[])?;
        total = Some(match total {
            Some(t) => cx.call("add", &[Some(t), Some(y)], &[])?,
            None => y,
        });
    }
    let counts = match total {
        Some(t) => t,
        None => cx.call(
            "zeros",
            &[],
            &[
                ("size", list(&[b as i64, width as i64])),
                ("dtype", Attr::DType(DType::F32)),
            ],
        )?,
    };
    let weighted = match (mode.as_str(), weights) {
        ("TF", _) | ("TFIDF", None) => counts,
        ("IDF", w) => {
            let seen = cx.with_scalar("gt", counts, 0.0)?;
            let w = w.unwrap_or_else(|| vec![1.0; width]);
            let w = cx.tensor(&Tensor::from_vec(w[..width].to_vec(), &[width])?)?;
            let zero = cx.scalar(0.0, DType::F32)?;
            cx.call("where", &[Some(seen), Some(w), Some(zero)], &[])?
        }
        ("TFIDF", Some(w)) => {
            let w = cx.tensor(&Tensor::from_vec(w[..width].to_vec(), &[width])?)?;
            cx.call("mul", &[Some(counts), Some(w)], &[])?
        }
        (m, _) => bail!(Value, "mode '{m}' is not one of TF, IDF, TFIDF"),
    };
    one(match rows {
        Some(_) => weighted,
        None => cx.call(
            "reshape",
            &[Some(weighted)],
            &[("shape", list(&[width as i64]))],
        )?,
    })
}
