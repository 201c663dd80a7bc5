//! Parsing and checking of einsum equations (`"ij,jk->ik"`, `"...ii->...i"`), with
//! PyTorch's rules: spaces are ignored, subscripts are `[a-zA-Z]`, an ellipsis stands for the
//! dims not named (broadcast across operands, aligned from the right), size-1 dims broadcast,
//! and without `->` the output is the ellipsis dims followed by the subscripts that appear
//! exactly once, in sorted order (uppercase before lowercase).

use crate::ir::shape::Shape;
use crate::{Result, bail};

/// Number of letter labels: `A`-`Z` are 0..26 and `a`-`z` are 26..52. Ellipsis dims are
/// labels from 52 on, the last ellipsis dim of the widest operand being the highest.
pub const LETTERS: usize = 52;

/// A checked einsum equation: which label each dim of each operand carries, the labels of
/// the output, and the size of every label.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct EinsumSpec {
    /// Per operand, the label of each of its dims.
    pub inputs: Vec<Vec<usize>>,
    /// The labels of the output dims, in order.
    pub output: Vec<usize>,
    /// Size of each label (after broadcasting); 0-sized labels are real sizes.
    pub sizes: Vec<usize>,
}

/// One side of an operand or output: its letter labels and where its ellipsis sits.
struct Term {
    labels: Vec<usize>,
    /// Index in `labels` at which the ellipsis dims go, if there is an ellipsis.
    ellipsis: Option<usize>,
}

fn letter_label(c: u8) -> Option<usize> {
    match c {
        b'A'..=b'Z' => Some((c - b'A') as usize),
        b'a'..=b'z' => Some((c - b'a') as usize + 26),
        _ => None,
    }
}

/// The subscript a label prints as (`i`, or `...` for an ellipsis dim).
pub fn label_name(l: usize) -> String {
    match l {
        0..26 => ((b'A' + l as u8) as char).to_string(),
        26..LETTERS => ((b'a' + (l - 26) as u8) as char).to_string(),
        _ => "...".to_string(),
    }
}

/// Parses one term starting at byte `start` of `eq`; `who` names it in messages.
fn parse_term(eq: &[u8], start: usize, end: usize, who: &str) -> Result<Term> {
    let mut labels = Vec::new();
    let mut ellipsis = None;
    let mut i = start;
    while i < end {
        let c = eq[i];
        if c == b' ' {
            i += 1;
        } else if c == b'.' {
            if ellipsis.is_some() {
                bail!(
                    Value,
                    "einsum(): found '.' for {who} for which an ellipsis was already found"
                );
            }
            if i + 2 >= end || eq[i + 1] != b'.' || eq[i + 2] != b'.' {
                bail!(
                    Value,
                    "einsum(): found '.' for {who} that is not part of any ellipsis"
                );
            }
            ellipsis = Some(labels.len());
            i += 3;
        } else if let Some(l) = letter_label(c) {
            labels.push(l);
            i += 1;
        } else {
            bail!(
                Value,
                "einsum(): invalid subscript given at index {i} in the equation string, subscripts must be in [a-zA-Z]"
            );
        }
    }
    Ok(Term { labels, ellipsis })
}

/// Records that `label` has size `s` in operand `op`; size 1 broadcasts against any size.
fn see_size(sizes: &mut [Option<usize>], label: usize, s: usize, op: usize) -> Result<()> {
    match sizes[label] {
        Some(prev) if prev != s && prev != 1 && s != 1 => {
            if label < LETTERS {
                bail!(
                    Shape,
                    "einsum(): subscript {} has size {s} for operand {op} which does not broadcast with previously seen size {prev}",
                    label_name(label)
                );
            }
            bail!(
                Shape,
                "einsum(): the ellipsis dimension {} has size {s} for operand {op} which does not broadcast with previously seen size {prev}",
                label - LETTERS
            );
        }
        Some(prev) if prev != 1 => {}
        _ => sizes[label] = Some(s),
    }
    Ok(())
}

impl EinsumSpec {
    /// Parses `equation` for operands of the given shapes, with PyTorch's checks and messages.
    pub fn parse(equation: &str, shapes: &[&[usize]]) -> Result<EinsumSpec> {
        let eq = equation.as_bytes();
        let arrow = equation.find("->");
        let lhs_end = arrow.unwrap_or(eq.len());
        // operand terms, split at commas
        let mut terms = Vec::new();
        let mut start = 0;
        for i in 0..=lhs_end {
            if i == lhs_end || eq[i] == b',' {
                let who = format!("operand {}", terms.len());
                terms.push(parse_term(eq, start, i, &who)?);
                start = i + 1;
            }
        }
        if terms.len() < shapes.len() {
            bail!(
                Value,
                "einsum(): more operands were provided than specified in the equation"
            );
        }
        if terms.len() > shapes.len() {
            bail!(
                Value,
                "einsum(): fewer operands were provided than specified in the equation"
            );
        }
        // how many dims each ellipsis covers
        let mut ell_dims = vec![0; terms.len()];
        for (i, (t, s)) in terms.iter().zip(shapes).enumerate() {
            let n = t.labels.len();
            match t.ellipsis {
                None if n != s.len() => bail!(
                    Shape,
                    "einsum(): the number of subscripts in the equation ({n}) does not match the number of dimensions ({}) for operand {i} and no ellipsis was given",
                    s.len()
                ),
                Some(_) if n > s.len() => bail!(
                    Shape,
                    "einsum(): the number of subscripts in the equation ({n}) is more than the number of dimensions ({}) for operand {i}",
                    s.len()
                ),
                Some(_) => ell_dims[i] = s.len() - n,
                None => {}
            }
        }
        let ell = ell_dims.iter().copied().max().unwrap_or(0);
        let mut sizes: Vec<Option<usize>> = vec![None; LETTERS + ell];
        let mut inputs = Vec::with_capacity(terms.len());
        for (i, (t, s)) in terms.iter().zip(shapes).enumerate() {
            let at = t.ellipsis.unwrap_or(t.labels.len());
            let mut labels: Vec<usize> = t.labels[..at].to_vec();
            labels.extend((ell - ell_dims[i]..ell).map(|k| LETTERS + k));
            labels.extend_from_slice(&t.labels[at..]);
            for (d, &l) in labels.iter().enumerate() {
                if let Some(first) = labels[..d].iter().position(|&m| m == l)
                    && s[first] != s[d]
                {
                    bail!(
                        Shape,
                        "einsum(): subscript {} is repeated for operand {i} but the sizes don't match, {} != {}",
                        label_name(l),
                        s[first],
                        s[d]
                    );
                }
            }
            for (d, &l) in labels.iter().enumerate() {
                see_size(&mut sizes, l, s[d], i)?;
            }
            inputs.push(labels);
        }
        let output = match arrow {
            Some(a) => Self::explicit_output(eq, a + 2, &sizes, ell)?,
            None => Self::implicit_output(&inputs, ell),
        };
        Ok(EinsumSpec {
            inputs,
            output,
            sizes: sizes.into_iter().map(|s| s.unwrap_or(1)).collect(),
        })
    }

    fn explicit_output(
        eq: &[u8],
        start: usize,
        sizes: &[Option<usize>],
        ell: usize,
    ) -> Result<Vec<usize>> {
        let t = parse_term(eq, start, eq.len(), "output")?;
        for (j, &l) in t.labels.iter().enumerate() {
            if sizes[l].is_none() {
                bail!(
                    Value,
                    "einsum(): output subscript {} does not appear in the equation for any input operand",
                    label_name(l)
                );
            }
            if t.labels[..j].contains(&l) {
                bail!(
                    Value,
                    "einsum(): output subscript {} appears more than once in the output",
                    label_name(l)
                );
            }
        }
        let at = t.ellipsis.unwrap_or(t.labels.len());
        let mut out: Vec<usize> = t.labels[..at].to_vec();
        if t.ellipsis.is_some() {
            out.extend((0..ell).map(|k| LETTERS + k));
        }
        out.extend_from_slice(&t.labels[at..]);
        Ok(out)
    }

    fn implicit_output(inputs: &[Vec<usize>], ell: usize) -> Vec<usize> {
        let mut count = [0usize; LETTERS];
        for labels in inputs {
            for &l in labels.iter().filter(|&&l| l < LETTERS) {
                count[l] += 1;
            }
        }
        let mut out: Vec<usize> = (0..ell).map(|k| LETTERS + k).collect();
        out.extend((0..LETTERS).filter(|&l| count[l] == 1));
        out
    }

    /// The shape of the result.
    pub fn output_shape(&self) -> Shape {
        self.output.iter().map(|&l| self.sizes[l]).collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn shape(eq: &str, shapes: &[&[usize]]) -> Result<Shape> {
        EinsumSpec::parse(eq, shapes).map(|s| s.output_shape())
    }

    #[test]
    fn shapes_of_common_equations() {
        assert_eq!(shape("ij,jk->ik", &[&[2, 3], &[3, 4]]).unwrap(), vec![2, 4]);
        assert_eq!(shape("ij,jk", &[&[2, 3], &[3, 4]]).unwrap(), vec![2, 4]);
        assert_eq!(shape("ba", &[&[2, 3]]).unwrap(), vec![3, 2]);
        assert_eq!(shape("ii->i", &[&[3, 3]]).unwrap(), vec![3]);
        assert_eq!(shape("ii", &[&[3, 3]]).unwrap(), Vec::<usize>::new());
        assert_eq!(
            shape(" b i j , b j k -> b i k ", &[&[5, 2, 3], &[5, 3, 4]]).unwrap(),
            vec![5, 2, 4]
        );
        assert_eq!(
            shape("...ij,...jk", &[&[7, 1, 2, 3], &[5, 3, 4]]).unwrap(),
            vec![7, 5, 2, 4]
        );
        assert_eq!(shape("i...->...", &[&[2, 3, 4]]).unwrap(), vec![3, 4]);
        assert_eq!(shape("Ab,a->bAa", &[&[2, 3], &[4]]).unwrap(), vec![3, 2, 4]);
        assert_eq!(shape("i,i->i", &[&[3], &[1]]).unwrap(), vec![3]);
        assert_eq!(
            shape("aB,Ba", &[&[2, 3], &[3, 2]]).unwrap(),
            Vec::<usize>::new()
        );
        assert_eq!(shape("bA", &[&[2, 3]]).unwrap(), vec![3, 2]);
    }

    #[test]
    fn errors_name_the_subscript_or_operand() {
        let e = |eq: &str, s: &[&[usize]]| shape(eq, s).unwrap_err().to_string();
        assert_eq!(
            e("ij,jk->ik", &[&[2, 2], &[3, 4]]),
            "einsum(): subscript j has size 3 for operand 1 which does not broadcast with previously seen size 2"
        );
        assert_eq!(
            e("ij,j1->i", &[&[2, 2], &[2, 2]]),
            "einsum(): invalid subscript given at index 4 in the equation string, subscripts must be in [a-zA-Z]"
        );
        assert_eq!(
            e("ij,jk->ik", &[&[2, 2]]),
            "einsum(): fewer operands were provided than specified in the equation"
        );
        assert_eq!(
            e("ij->ik", &[&[2, 2]]),
            "einsum(): output subscript k does not appear in the equation for any input operand"
        );
        assert_eq!(
            e("ij->ii", &[&[2, 2]]),
            "einsum(): output subscript i appears more than once in the output"
        );
        assert_eq!(
            e("ii->i", &[&[2, 3]]),
            "einsum(): subscript i is repeated for operand 0 but the sizes don't match, 2 != 3"
        );
        assert!(
            e("ijk", &[&[2, 2]])
                .contains("does not match the number of dimensions (2) for operand 0")
        );
        assert!(e("i.j", &[&[2, 2]]).contains("not part of any ellipsis"));
        assert!(e("i..", &[&[2, 2]]).contains("not part of any ellipsis"));
        assert!(e("...i...", &[&[2, 2]]).contains("ellipsis was already found"));
        assert!(e("i,i", &[&[2], &[2], &[2]]).contains("more operands"));
        assert!(
            e("...i,...i", &[&[2, 3], &[4, 3]])
                .contains("ellipsis dimension 0 has size 4 for operand 1")
        );
        assert!(e("ij-ij", &[&[2, 2]]).contains("invalid subscript given at index 2"));
    }
}
