//! The header every rank sends its peers before a collective: what it is about to do, so
//! that ranks that disagree stop with an error naming the difference instead of reading
//! each other's bytes wrongly or hanging.

use super::ReduceOp;
use super::comm_thread::Collective;
use crate::ir::dtype::DType;
use crate::{Error, Result};

/// Words in a header (128 bytes).
pub(crate) const WORDS: usize = 16;
/// Dims a header spells out; longer shapes are compared through a hash of the rest.
const DIMS: usize = 11;

/// One rank's header, as sent.
pub(crate) type Header = [u64; WORDS];

const OPS: [ReduceOp; 5] = [
    ReduceOp::Sum,
    ReduceOp::Avg,
    ReduceOp::Max,
    ReduceOp::Min,
    ReduceOp::Product,
];

fn kind_code(c: Collective) -> (u64, u64) {
    let op = |o: ReduceOp| OPS.iter().position(|x| *x == o).unwrap_or(0) as u64;
    match c {
        Collective::AllReduce(o) => (1, op(o)),
        Collective::Broadcast(root) => (2, root as u64),
        Collective::AllGather => (3, 0),
        Collective::ReduceScatter(o) => (4, op(o)),
        Collective::Barrier => (5, 0),
    }
}

/// The header of collective number `seq`: `what` over a tensor of `dtype` and `shape`.
pub(crate) fn encode(seq: u64, what: Collective, dtype: DType, shape: &[usize]) -> Header {
    let mut h = [0u64; WORDS];
    let (kind, arg) = kind_code(what);
    h[0] = seq;
    h[1] = kind;
    h[2] = arg;
    h[3] = DType::ALL.iter().position(|d| *d == dtype).unwrap_or(0) as u64;
    h[4] = shape.len() as u64;
    for (w, &d) in h[5..5 + DIMS].iter_mut().zip(shape) {
        *w = d as u64;
    }
    // FNV-1a over the dims a header cannot spell out
    h[WORDS - 1] = shape
        .iter()
        .skip(DIMS)
        .fold(0xcbf2_9ce4_8422_2325, |acc, &d| {
            (acc ^ d as u64).wrapping_mul(0x0100_0000_01b3)
        });
    h
}

/// A header in words people read: `all_reduce(sum) of f32[4, 3]`.
fn describe(h: &Header) -> String {
    let what = match h[1] {
        1 => format!("all_reduce({})", op_name(h[2])),
        2 => format!("broadcast(src={})", h[2]),
        3 => "all_gather".to_string(),
        4 => format!("reduce_scatter({})", op_name(h[2])),
        5 => return "barrier".to_string(),
        k => format!("an unknown collective ({k})"),
    };
    let dtype = DType::ALL
        .get(h[3] as usize)
        .map_or("?".to_string(), |d| d.to_string());
    let n = h[4] as usize;
    let mut dims: Vec<String> = h[5..5 + DIMS.min(n)].iter().map(u64::to_string).collect();
    if n > DIMS {
        dims.push(format!("... ({n} dims)"));
    }
    format!("{what} of {dtype}[{}]", dims.join(", "))
}

fn op_name(code: u64) -> &'static str {
    OPS.get(code as usize).map_or("?", |o| o.name())
}

/// Checks that every rank sent the same header for collective `seq`; otherwise the error
/// every rank returns (the same text on each, since each sees all the headers).
pub(crate) fn agree(seq: u64, name: &str, headers: &[Header]) -> Result<()> {
    let Some(first) = headers.first() else {
        return Ok(());
    };
    if headers.iter().all(|h| h == first) {
        return Ok(());
    }
    // group the ranks by what they passed, in order of first appearance
    let mut groups: Vec<(&Header, Vec<usize>)> = Vec::new();
    for (r, h) in headers.iter().enumerate() {
        match groups.iter_mut().find(|(g, _)| *g == h) {
            Some((_, ranks)) => ranks.push(r),
            None => groups.push((h, vec![r])),
        }
    }
    let parts: Vec<String> = groups
        .iter()
        .map(|(h, ranks)| {
            let who = if ranks.len() == 1 { "rank" } else { "ranks" };
            let list: Vec<String> = ranks.iter().map(usize::to_string).collect();
            let seq = if h[0] == seq {
                String::new()
            } else {
                format!(" as its collective #{}", h[0])
            };
            format!("{who} {} called {}{seq}", list.join(", "), describe(h))
        })
        .collect();
    Err(Error::Distributed(format!(
        "{name} #{seq}: the ranks disagree: {}",
        parts.join("; ")
    )))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn equal_headers_agree_and_different_ones_are_named() {
        let a = encode(3, Collective::AllReduce(ReduceOp::Sum), DType::F32, &[4, 3]);
        let b = encode(3, Collective::AllReduce(ReduceOp::Sum), DType::F32, &[5]);
        assert!(agree(3, "all_reduce", &[a, a]).is_ok());
        let e = agree(3, "all_reduce", &[a, b, a]).unwrap_err().to_string();
        assert_eq!(
            e,
            "all_reduce #3: the ranks disagree: ranks 0, 2 called all_reduce(sum) of f32[4, 3]; rank 1 called all_reduce(sum) of f32[5]"
        );
        let c = encode(3, Collective::Broadcast(1), DType::I64, &[]);
        let e = agree(3, "all_reduce", &[a, c]).unwrap_err().to_string();
        assert!(e.contains("rank 1 called broadcast(src=1) of i64[]"), "{e}");
    }

    #[test]
    fn long_shapes_differ_by_their_hidden_dims() {
        let mut s: Vec<usize> = vec![1; 14];
        let a = encode(0, Collective::AllGather, DType::U8, &s);
        s[13] = 2;
        let b = encode(0, Collective::AllGather, DType::U8, &s);
        assert_ne!(a, b);
        let e = agree(0, "all_gather", &[a, b]).unwrap_err().to_string();
        assert!(e.contains("(14 dims)"), "{e}");
    }
}
