//! Shrinking a failing case: smaller `.smelt` texts are tried one edit at a time, and the
//! first that still fails is kept, until no edit does. The edits, each checked by parsing
//! again (the verifier decides what is still a graph):
//! - drop one of several outputs;
//! - bypass a statement: its uses read one of its operands instead, and it goes;
//! - drop a statement nothing reads, or an input nothing reads;
//! - halve an input's dim, or make it 1.

use crate::ir::text::parse_module;

/// The smallest text reached from `text` by edits after which `fails` still holds, trying
/// at most `budget` candidates.
pub fn shrink(text: &str, fails: &mut dyn FnMut(&str) -> bool, budget: usize) -> String {
    let mut best = text.to_string();
    let mut tried = 0;
    'outer: loop {
        for cand in candidates(&best) {
            if tried >= budget {
                break 'outer;
            }
            if parse_module(&cand, "shrink.smelt").is_err() {
                continue;
            }
            tried += 1;
            if fails(&cand) {
                best = cand;
                continue 'outer;
            }
        }
        break;
    }
    best
}

/// Whether `line` mentions value `name` (as `%name`, not a prefix of a longer name).
fn mentions(line: &str, name: &str) -> bool {
    find_value(line, name).is_some()
}

fn find_value(line: &str, name: &str) -> Option<usize> {
    let pat = format!("%{name}");
    let mut from = 0;
    while let Some(i) = line[from..].find(&pat) {
        let at = from + i;
        let end = at + pat.len();
        let next = line[end..].chars().next();
        if !next.is_some_and(|c| c.is_alphanumeric() || c == '_' || c == '.') {
            return Some(at);
        }
        from = end;
    }
    None
}

/// `line` with every mention of `%from` read as `%to`.
fn rename(line: &str, from: &str, to: &str) -> String {
    let mut out = line.to_string();
    while let Some(at) = find_value(&out, from) {
        out.replace_range(at..at + from.len() + 1, &format!("%{to}"));
    }
    out
}

/// The value names a statement line reads (after its `=`).
fn operands(line: &str) -> Vec<String> {
    let Some((_, rhs)) = line.split_once('=') else {
        return Vec::new();
    };
    rhs.split('%')
        .skip(1)
        .map(|s| {
            s.chars()
                .take_while(|c| c.is_alphanumeric() || *c == '_' || *c == '.')
                .collect::<String>()
        })
        .filter(|s| !s.is_empty())
        .collect()
}

/// The name a statement line defines (`%v = ...`).
fn defined(line: &str) -> Option<String> {
    let (lhs, _) = line.split_once('=')?;
    // `%v = ...` or, as the printer writes it, `%v: f32[2, 3] = ...`
    let name = lhs.trim().strip_prefix('%')?.split(':').next()?.trim();
    (!name.is_empty()
        && name
            .chars()
            .all(|c| c.is_alphanumeric() || c == '_' || c == '.'))
    .then(|| name.to_string())
}

fn candidates(text: &str) -> Vec<String> {
    let lines: Vec<&str> = text.lines().collect();
    let join = |ls: &[String]| ls.join("\n") + "\n";
    let owned: Vec<String> = lines.iter().map(|s| s.to_string()).collect();
    let mut out = Vec::new();
    // fewer outputs
    if let Some(r) = lines
        .iter()
        .position(|l| l.trim_start().starts_with("return "))
    {
        let outs: Vec<&str> = lines[r].trim_start()["return ".len()..]
            .split(',')
            .map(str::trim)
            .collect();
        if outs.len() > 1 {
            for skip in 0..outs.len() {
                let kept: Vec<&str> = outs
                    .iter()
                    .enumerate()
                    .filter(|(i, _)| *i != skip)
                    .map(|(_, o)| *o)
                    .collect();
                let mut ls = owned.clone();
                ls[r] = format!("  return {}", kept.join(", "));
                out.push(join(&ls));
            }
        }
    }
    // bypass or drop statements, last first
    for (i, line) in lines.iter().enumerate().rev() {
        let Some(v) = defined(line) else { continue };
        let used = lines[i + 1..].iter().any(|l| mentions(l, &v));
        if !used {
            let mut ls = owned.clone();
            ls.remove(i);
            out.push(join(&ls));
            continue;
        }
        for u in operands(line) {
            let mut ls: Vec<String> = owned.clone();
            for l in ls.iter_mut().skip(i + 1) {
                *l = rename(l, &v, &u);
            }
            ls.remove(i);
            out.push(join(&ls));
        }
    }
    // unused inputs and smaller input dims, in the signature
    if let Some(h) = lines.iter().position(|l| l.starts_with("graph ")) {
        let header = lines[h];
        if let (Some(open), Some(close)) = (header.find('('), header.rfind(')')) {
            let params: Vec<&str> = split_params(&header[open + 1..close]);
            // the text with the signature's parameters replaced
            let with_params = |ps: &str| {
                let mut ls = owned.clone();
                ls[h] = format!("{}{ps}{}", &header[..open + 1], &header[close..]);
                join(&ls)
            };
            for (p, param) in params.iter().enumerate() {
                let name = param
                    .trim()
                    .trim_start_matches('%')
                    .split(':')
                    .next()
                    .unwrap_or("")
                    .trim();
                if !lines[h + 1..].iter().any(|l| mentions(l, name)) {
                    let kept: Vec<&str> = params
                        .iter()
                        .enumerate()
                        .filter(|(i, _)| *i != p)
                        .map(|(_, s)| *s)
                        .collect();
                    out.push(with_params(&kept.join(",")));
                }
                for smaller in smaller_dims(param) {
                    let mut ps: Vec<String> = params.iter().map(|s| s.to_string()).collect();
                    ps[p] = smaller;
                    out.push(with_params(&ps.join(",")));
                }
            }
        }
    }
    out
}

/// The parameters of a signature, split at the commas outside brackets.
fn split_params(s: &str) -> Vec<&str> {
    let (mut out, mut depth, mut start) = (Vec::new(), 0, 0);
    for (i, c) in s.char_indices() {
        match c {
            '[' => depth += 1,
            ']' => depth -= 1,
            ',' if depth == 0 => {
                out.push(&s[start..i]);
                start = i + 1;
            }
            _ => {}
        }
    }
    if !s[start..].trim().is_empty() {
        out.push(&s[start..]);
    }
    out
}

/// `param` (`%x: f32[8, 3]`) with one dim halved or made 1.
fn smaller_dims(param: &str) -> Vec<String> {
    let (Some(open), Some(close)) = (param.find('['), param.rfind(']')) else {
        return Vec::new();
    };
    let dims: Vec<&str> = param[open + 1..close].split(',').map(str::trim).collect();
    let mut out = Vec::new();
    for (d, text) in dims.iter().enumerate() {
        let Ok(n) = text.parse::<usize>() else {
            continue;
        };
        for m in [1, n / 2] {
            if m >= 1 && m < n {
                let mut ds: Vec<String> = dims.iter().map(|s| s.to_string()).collect();
                ds[d] = m.to_string();
                out.push(format!(
                    "{}{}{}",
                    &param[..open + 1],
                    ds.join(", "),
                    &param[close..]
                ));
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn renames_whole_names_only() {
        assert_eq!(
            rename("  %y = add(%x, %x1)", "x", "z"),
            "  %y = add(%z, %x1)"
        );
        assert_eq!(operands("  %y = add(%x, %x1)"), vec!["x", "x1"]);
        assert_eq!(defined("  %y = add(%x, %x1)").as_deref(), Some("y"));
        assert_eq!(
            defined("  %y: f32[2, 3] = add(%x, %x1)").as_deref(),
            Some("y")
        );
    }

    #[test]
    fn shrinks_to_the_statement_that_fails() {
        let text = "graph f(%a: f32[4, 6], %b: f32[6]) {\n  %c = add(%a, %b)\n  %d = exp(%c)\n  %e = neg(%d)\n  %f = mul(%e, 2.0)\n  return %f, %c\n}\n";
        // "fails" while an exp is left
        let small = shrink(text, &mut |t: &str| t.contains("exp("), 1000);
        let m = parse_module(&small, "s.smelt").unwrap();
        assert!(m.entry().len() <= 3, "{small}");
        assert!(small.contains("exp("), "{small}");
        assert!(small.contains("f32[1"), "dims shrink too: {small}");
    }
}
