//! Symbolic dimensions (`.smelt` version 3): a size written as a name (`B`, `S`) or as an
//! expression of names and integers with `+ - * //` (`B*S`, `S-1`).
//!
//! A graph with symbols is kept as its text and read again for each binding of its symbols
//! (`text::SymbolicModule`); this module holds the expressions, their values under a binding
//! and the sizes used to verify a graph for every binding at once.

use std::collections::BTreeMap;
use std::fmt;

/// Sizes of symbols, by name. Ordered, so that it can key a cache.
pub type Bindings = BTreeMap<String, i64>;

/// A dimension as written: an integer, a symbol, or `+ - * //` of two dimensions.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub enum DimExpr {
    /// A literal size.
    Int(i64),
    /// A symbol.
    Sym(String),
    /// `a + b`.
    Add(Box<DimExpr>, Box<DimExpr>),
    /// `a - b`.
    Sub(Box<DimExpr>, Box<DimExpr>),
    /// `a * b`.
    Mul(Box<DimExpr>, Box<DimExpr>),
    /// `a // b`: Python's floor division.
    FloorDiv(Box<DimExpr>, Box<DimExpr>),
}

impl DimExpr {
    /// Whether it names no symbol.
    pub fn is_constant(&self) -> bool {
        self.symbols().is_empty()
    }

    /// The symbols it names, each once, in order of first appearance.
    pub fn symbols(&self) -> Vec<&str> {
        let mut out = Vec::new();
        self.collect(&mut out);
        out
    }

    fn collect<'a>(&'a self, out: &mut Vec<&'a str>) {
        match self {
            DimExpr::Int(_) => {}
            DimExpr::Sym(s) => {
                if !out.contains(&s.as_str()) {
                    out.push(s);
                }
            }
            DimExpr::Add(a, b)
            | DimExpr::Sub(a, b)
            | DimExpr::Mul(a, b)
            | DimExpr::FloorDiv(a, b) => {
                a.collect(out);
                b.collect(out);
            }
        }
    }

    /// Its value under `env`; an unbound symbol, an overflow or a division by zero is an
    /// error message.
    pub fn eval(&self, env: &Bindings) -> Result<i64, String> {
        let two = |a: &DimExpr, b: &DimExpr| Ok::<_, String>((a.eval(env)?, b.eval(env)?));
        let overflow = || format!("{self} overflows at {}", describe(self, env));
        match self {
            DimExpr::Int(n) => Ok(*n),
            DimExpr::Sym(s) => env
                .get(s)
                .copied()
                .ok_or_else(|| format!("symbol {s} has no size")),
            DimExpr::Add(a, b) => {
                let (x, y) = two(a, b)?;
                x.checked_add(y).ok_or_else(overflow)
            }
            DimExpr::Sub(a, b) => {
                let (x, y) = two(a, b)?;
                x.checked_sub(y).ok_or_else(overflow)
            }
            DimExpr::Mul(a, b) => {
                let (x, y) = two(a, b)?;
                x.checked_mul(y).ok_or_else(overflow)
            }
            DimExpr::FloorDiv(a, b) => {
                let (x, y) = two(a, b)?;
                if y == 0 {
                    return Err(format!("{self} divides by zero at {}", describe(self, env)));
                }
                floor_div(x, y).ok_or_else(overflow)
            }
        }
    }

    /// The value of `sym` that gives this expression the value `target`, when it is the only
    /// unbound symbol and the expression is affine in it (`a*sym + c`); `None` otherwise.
    pub fn solve(&self, sym: &str, target: i64, env: &Bindings) -> Option<i64> {
        let at = |v: i64| {
            let mut e = env.clone();
            e.insert(sym.to_string(), v);
            self.eval(&e).ok()
        };
        let c = at(0)?;
        let a = at(1)?.checked_sub(c)?;
        let rest = target.checked_sub(c)?;
        if rest.checked_rem(a) != Some(0) {
            return None;
        }
        let v = rest.checked_div(a)?;
        (v >= 0 && at(v) == Some(target)).then_some(v)
    }

    fn precedence(&self) -> u8 {
        match self {
            DimExpr::Add(..) | DimExpr::Sub(..) => 1,
            DimExpr::Mul(..) | DimExpr::FloorDiv(..) => 2,
            DimExpr::Int(n) if *n < 0 => 1,
            DimExpr::Int(_) | DimExpr::Sym(_) => 3,
        }
    }
}

/// Python's `//` (rounds toward negative infinity); `None` on overflow.
pub fn floor_div(x: i64, y: i64) -> Option<i64> {
    let q = x.checked_div(y)?;
    Some(if x % y != 0 && ((x < 0) != (y < 0)) {
        q - 1
    } else {
        q
    })
}

/// `S = 0, T = 3`: the sizes of the symbols `e` names.
pub fn describe(e: &DimExpr, env: &Bindings) -> String {
    e.symbols()
        .iter()
        .map(|s| match env.get(*s) {
            Some(v) => format!("{s} = {v}"),
            None => format!("{s} unbound"),
        })
        .collect::<Vec<_>>()
        .join(", ")
}

impl fmt::Display for DimExpr {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let (a, b, op, p) = match self {
            DimExpr::Int(n) => return write!(f, "{n}"),
            DimExpr::Sym(s) => return f.write_str(s),
            DimExpr::Add(a, b) => (a, b, "+", 1),
            DimExpr::Sub(a, b) => (a, b, "-", 1),
            DimExpr::Mul(a, b) => (a, b, "*", 2),
            DimExpr::FloorDiv(a, b) => (a, b, "//", 2),
        };
        // left-associative: the right side needs parentheses at equal precedence
        if a.precedence() < p {
            write!(f, "({a})")?;
        } else {
            write!(f, "{a}")?;
        }
        f.write_str(op)?;
        if b.precedence() <= p {
            write!(f, "({b})")
        } else {
            write!(f, "{b}")
        }
    }
}

/// Sample sizes: per ladder, per point, the first prime and which primes after it
/// (every `step`-th). Ladder 0's sizes are large (above 100) and ladder 1's small (above 10,
/// for graphs whose sizes are capped, such as a position table of 64).
const LADDERS: [[(i64, usize); 3]; 2] =
    [[(101, 1), (211, 3), (307, 2)], [(11, 1), (23, 2), (37, 3)]];

/// How many sets of sample sizes there are ([`sample_size`]'s `ladder`).
pub const SAMPLE_LADDERS: usize = LADDERS.len();

/// The size symbol number `index` takes at sample point `point` (0 to 2) of ladder `ladder`:
/// a prime, each symbol's different, with different gaps at each point, so that a relation
/// that holds at two points (`B + 2 = S`, `B*S = T`) is very unlikely to hold by chance
/// rather than for every size.
pub fn sample_size(index: usize, ladder: usize, point: usize) -> i64 {
    let (start, step) = LADDERS[ladder.min(LADDERS.len() - 1)][point.min(2)];
    let mut n = start;
    let mut seen = 0;
    loop {
        if is_prime(n) {
            if seen == index * step {
                return n;
            }
            seen += 1;
        }
        n += 1;
    }
}

/// The sizes of `symbols` at sample point `point` of ladder `ladder` ([`sample_size`] by
/// each symbol's position).
pub fn sample_point(symbols: &[String], ladder: usize, point: usize) -> Bindings {
    symbols
        .iter()
        .enumerate()
        .map(|(i, s)| (s.clone(), sample_size(i, ladder, point)))
        .collect()
}

/// `attempt` at each ladder of sample sizes in turn (large sizes first, then small ones for
/// graphs whose sizes are capped): its first success, or the first ladder's error.
pub fn on_some_ladder<T>(mut attempt: impl FnMut(usize) -> crate::Result<T>) -> crate::Result<T> {
    let mut first_error = None;
    for ladder in 0..SAMPLE_LADDERS {
        match attempt(ladder) {
            Ok(t) => return Ok(t),
            Err(e) => {
                first_error.get_or_insert(e);
            }
        }
    }
    Err(first_error.unwrap_or_else(|| crate::Error::Value("no sample sizes".into())))
}

/// The expression `a*m + c` (`m` a product of one to three of `symbols`, `a` and `c`
/// integers) that has value `values[i]` at sizes `points[i]` for every `i`, simplest `m`
/// first; `None` when there is none. With three points or more, a fit is very unlikely to
/// be a coincidence.
pub fn fit(symbols: &[String], points: &[Bindings], values: &[i64]) -> Option<DimExpr> {
    if points.len() < 2 || points.len() != values.len() {
        return None;
    }
    let n = symbols.len();
    let mut monomials: Vec<Vec<usize>> = (0..n).map(|i| vec![i]).collect();
    for i in 0..n {
        for j in i..n {
            monomials.push(vec![i, j]);
        }
    }
    for i in 0..n {
        for j in i..n {
            for k in j..n {
                monomials.push(vec![i, j, k]);
            }
        }
    }
    for m in monomials {
        let at = |p: &Bindings| {
            m.iter()
                .try_fold(1i64, |acc, &i| acc.checked_mul(*p.get(&symbols[i])?))
        };
        let Some(ms) = points.iter().map(at).collect::<Option<Vec<i64>>>() else {
            continue;
        };
        let (Some(dm), Some(dv)) = (ms[1].checked_sub(ms[0]), values[1].checked_sub(values[0]))
        else {
            continue;
        };
        if dv == 0 || dv.checked_rem(dm) != Some(0) {
            continue;
        }
        let Some(a) = dv.checked_div(dm) else {
            continue;
        };
        let Some(c) = a.checked_mul(ms[0]).and_then(|x| values[0].checked_sub(x)) else {
            continue;
        };
        if ms
            .iter()
            .zip(values)
            .all(|(&x, &v)| a.checked_mul(x).and_then(|y| y.checked_add(c)) == Some(v))
        {
            let factors = (a != 1).then_some(DimExpr::Int(a)).into_iter();
            let e = factors
                .chain(m.iter().map(|&i| DimExpr::Sym(symbols[i].clone())))
                .reduce(|x, y| DimExpr::Mul(Box::new(x), Box::new(y)))?;
            return Some(match c {
                0 => e,
                c if c > 0 => DimExpr::Add(Box::new(e), Box::new(DimExpr::Int(c))),
                c => DimExpr::Sub(Box::new(e), Box::new(DimExpr::Int(-c))),
            });
        }
    }
    None
}

fn is_prime(n: i64) -> bool {
    n >= 2 && (2..).take_while(|d| d * d <= n).all(|d| n % d != 0)
}

/// Whether `name` can be a symbol: letters, digits and `_`, starting with a letter.
pub fn is_symbol_name(name: &str) -> bool {
    name.starts_with(|c: char| c.is_ascii_alphabetic())
        && name.chars().all(|c| c.is_ascii_alphanumeric() || c == '_')
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sym(s: &str) -> Box<DimExpr> {
        Box::new(DimExpr::Sym(s.into()))
    }
    fn int(n: i64) -> Box<DimExpr> {
        Box::new(DimExpr::Int(n))
    }

    #[test]
    fn prints_with_the_parentheses_it_needs() {
        let e = DimExpr::Mul(Box::new(DimExpr::Add(sym("B"), int(1))), sym("S"));
        assert_eq!(e.to_string(), "(B+1)*S");
        let e = DimExpr::Sub(sym("S"), Box::new(DimExpr::Sub(sym("T"), int(1))));
        assert_eq!(e.to_string(), "S-(T-1)");
        let e = DimExpr::FloorDiv(Box::new(DimExpr::Mul(sym("B"), sym("S"))), int(2));
        assert_eq!(e.to_string(), "B*S//2");
    }

    #[test]
    fn evaluates_like_python() {
        let env: Bindings = [("S".to_string(), 7), ("B".to_string(), 3)].into();
        let e = DimExpr::FloorDiv(Box::new(DimExpr::Sub(int(0), sym("S"))), int(2));
        assert_eq!(e.eval(&env), Ok(-4)); // Python: -7 // 2 == -4
        let e = DimExpr::FloorDiv(sym("S"), int(0));
        assert!(
            e.eval(&env)
                .unwrap_err()
                .contains("divides by zero at S = 7")
        );
        let e = DimExpr::Mul(sym("B"), sym("T"));
        assert_eq!(e.eval(&env), Err("symbol T has no size".into()));
        let big: Bindings = [("S".to_string(), i64::MAX)].into();
        assert!(DimExpr::Add(sym("S"), int(1)).eval(&big).is_err());
    }

    #[test]
    fn solves_affine_expressions_for_one_symbol() {
        let env: Bindings = [("B".to_string(), 2)].into();
        let e = DimExpr::Add(Box::new(DimExpr::Mul(sym("B"), sym("S"))), int(1));
        assert_eq!(e.solve("S", 15, &env), Some(7));
        assert_eq!(e.solve("S", 16, &env), None); // 2*S + 1 is odd
        let e = DimExpr::Mul(sym("S"), sym("S"));
        assert_eq!(e.solve("S", 9, &env), None); // not affine
    }

    #[test]
    fn sample_sizes_are_distinct_primes() {
        for ladder in 0..SAMPLE_LADDERS {
            for point in 0..3 {
                let v: Vec<i64> = (0..20).map(|i| sample_size(i, ladder, point)).collect();
                assert!(v.iter().all(|&n| n > 10 && is_prime(n)));
                let mut u = v.clone();
                u.dedup();
                assert_eq!(u.len(), v.len());
            }
        }
        assert_eq!(sample_size(0, 0, 0), 101);
        assert_eq!(sample_size(1, 0, 0), 103);
        assert_eq!(sample_size(1, 0, 1), 229); // 211, 223, 227, 229: every third prime
    }

    #[test]
    fn fits_affine_functions_of_products() {
        let syms = vec!["B".to_string(), "S".to_string()];
        let points: Vec<Bindings> = (0..3)
            .map(|p| {
                [
                    ("B".to_string(), sample_size(0, 0, p)),
                    ("S".to_string(), sample_size(1, 0, p)),
                ]
                .into()
            })
            .collect();
        let values = |f: &dyn Fn(i64, i64) -> i64| -> Vec<i64> {
            points.iter().map(|p| f(p["B"], p["S"])).collect()
        };
        let fitted =
            |f: &dyn Fn(i64, i64) -> i64| fit(&syms, &points, &values(f)).map(|e| e.to_string());
        assert_eq!(fitted(&|_, s| s), Some("S".into()));
        assert_eq!(fitted(&|_, s| s - 1), Some("S-1".into()));
        assert_eq!(fitted(&|b, s| 12 * b * s), Some("12*B*S".into()));
        assert_eq!(fitted(&|b, s| b * s * s + 3), Some("B*S*S+3".into()));
        // a floor division is no affine function of a product
        assert_eq!(fitted(&|_, s| s / 2), None);
        // extreme values are no expression, never an overflow
        let extreme = [i64::MIN, -1, i64::MAX];
        assert_eq!(fit(&syms, &points, &extreme), None);
        let env: Bindings = [("B".to_string(), 1)].into();
        assert_eq!(DimExpr::Sym("S".into()).solve("S", i64::MIN, &env), None);
    }
}
