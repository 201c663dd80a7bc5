//! A JSON value and its writer (the profiler's traces, `smelt profile --json`).

use std::fmt::Write as _;

/// A JSON value, written with proper string escaping; non-finite numbers become `null`.
#[derive(Clone, Debug, PartialEq)]
pub enum Json {
    /// A number.
    Num(f64),
    /// A string.
    Str(String),
    /// `true` or `false`.
    Bool(bool),
    /// An array.
    Arr(Vec<Json>),
    /// An object, its keys in the order given.
    Obj(Vec<(String, Json)>),
}

impl Json {
    /// Appends the value to `out` on one line.
    pub fn write(&self, out: &mut String) {
        match self {
            Json::Num(x) if x.is_finite() => {
                let _ = write!(out, "{x}");
            }
            Json::Num(_) => out.push_str("null"),
            Json::Bool(b) => out.push_str(if *b { "true" } else { "false" }),
            Json::Str(s) => write_str(out, s),
            Json::Arr(v) => {
                out.push('[');
                for (i, x) in v.iter().enumerate() {
                    if i > 0 {
                        out.push_str(", ");
                    }
                    x.write(out);
                }
                out.push(']');
            }
            Json::Obj(v) => {
                out.push('{');
                for (i, (k, x)) in v.iter().enumerate() {
                    if i > 0 {
                        out.push_str(", ");
                    }
                    write_str(out, k);
                    out.push_str(": ");
                    x.write(out);
                }
                out.push('}');
            }
        }
    }

    /// The value as a string of JSON.
    pub fn to_text(&self) -> String {
        let mut s = String::new();
        self.write(&mut s);
        s
    }

    /// A string value.
    pub fn str(s: impl Into<String>) -> Json {
        Json::Str(s.into())
    }

    /// An object from `(key, value)` pairs.
    pub fn obj<const N: usize>(pairs: [(&str, Json); N]) -> Json {
        Json::Obj(pairs.into_iter().map(|(k, v)| (k.to_string(), v)).collect())
    }
}

/// Appends `s` as a JSON string literal.
pub fn write_str(out: &mut String, s: &str) {
    out.push('"');
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            c if (c as u32) < 0x20 => {
                let _ = write!(out, "\\u{:04x}", c as u32);
            }
            c => out.push(c),
        }
    }
    out.push('"');
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn json_escapes_strings_and_nonfinite_numbers() {
        let j = Json::Obj(vec![
            ("a\"b\\".into(), Json::Str("x\ny\u{1}".into())),
            ("n".into(), Json::Num(f64::NAN)),
            (
                "v".into(),
                Json::Arr(vec![Json::Num(1.5), Json::Bool(true)]),
            ),
        ]);
        assert_eq!(
            j.to_text(),
            r#"{"a\"b\\": "x\ny\u0001", "n": null, "v": [1.5, true]}"#
        );
    }
}
