//! Tokens of the `.smelt` format, each with its line and column (1-based, in characters).

use std::fmt;

#[derive(Clone, Debug, PartialEq)]
pub enum Tok {
    /// A bare word: graph and op names, dtypes, `true`, `none`, `inf`, ...
    Ident(String),
    /// `%name` (the name without `%`).
    Value(String),
    /// `@name`: a graph of the same file (the name without `@`).
    GraphRef(String),
    Int(i64),
    Float(f64),
    Str(String),
    /// One of `( ) { } [ ] , : =`, or `+ - * /` in a symbolic dimension.
    Punct(char),
    Eof,
}

impl fmt::Display for Tok {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Tok::Ident(s) => write!(f, "'{s}'"),
            Tok::Value(s) => write!(f, "%{s}"),
            Tok::GraphRef(s) => write!(f, "@{s}"),
            Tok::Int(i) => write!(f, "{i}"),
            Tok::Float(x) => write!(f, "{x:?}"),
            Tok::Str(s) => write!(f, "\"{}\"", crate::ir::attrs::escape(s)),
            Tok::Punct(c) => write!(f, "'{c}'"),
            Tok::Eof => f.write_str("end of file"),
        }
    }
}

/// A token and where it starts.
#[derive(Clone, Debug, PartialEq)]
pub struct Token {
    pub tok: Tok,
    pub line: usize,
    pub col: usize,
}

/// A lexing error: position and message.
pub struct LexError {
    pub line: usize,
    pub col: usize,
    pub msg: String,
}

struct Lexer<'a> {
    chars: std::iter::Peekable<std::str::Chars<'a>>,
    line: usize,
    col: usize,
}

impl Lexer<'_> {
    fn peek(&mut self) -> Option<char> {
        self.chars.peek().copied()
    }

    fn bump(&mut self) -> Option<char> {
        let c = self.chars.next()?;
        if c == '\n' {
            self.line += 1;
            self.col = 1;
        } else {
            self.col += 1;
        }
        Some(c)
    }

    fn take_while(&mut self, f: impl Fn(char) -> bool) -> String {
        let mut s = String::new();
        while let Some(c) = self.peek().filter(|&c| f(c)) {
            s.push(c);
            self.bump();
        }
        s
    }

    fn skip_space_and_comments(&mut self) {
        while let Some(c) = self.peek() {
            if c == '#' {
                self.take_while(|c| c != '\n');
            } else if c.is_whitespace() {
                self.bump();
            } else {
                break;
            }
        }
    }
}

fn is_name_char(c: char) -> bool {
    c.is_ascii_alphanumeric() || c == '_' || c == '.'
}

/// Splits `text` into tokens, ending with `Eof`.
pub fn lex(text: &str) -> Result<Vec<Token>, LexError> {
    let mut lx = Lexer {
        chars: text.chars().peekable(),
        line: 1,
        col: 1,
    };
    let mut out = Vec::new();
    loop {
        lx.skip_space_and_comments();
        let (line, col) = (lx.line, lx.col);
        let fail = |msg: String| LexError { line, col, msg };
        let Some(c) = lx.peek() else {
            out.push(Token {
                tok: Tok::Eof,
                line,
                col,
            });
            return Ok(out);
        };
        let tok = match c {
            '(' | ')' | '{' | '}' | '[' | ']' | ',' | ':' | '=' => {
                lx.bump();
                Tok::Punct(c)
            }
            '%' => {
                lx.bump();
                let name = lx.take_while(is_name_char);
                if name.is_empty() {
                    return Err(fail("expected a value name after '%'".into()));
                }
                Tok::Value(name)
            }
            '@' => {
                lx.bump();
                let name = lx.take_while(is_name_char);
                if name.is_empty() {
                    return Err(fail("expected a graph name after '@'".into()));
                }
                Tok::GraphRef(name)
            }
            '"' => {
                lx.bump();
                Tok::Str(string_body(&mut lx).map_err(fail)?)
            }
            '+' | '*' | '/' => {
                lx.bump();
                Tok::Punct(c)
            }
            // `-` starts a number (`-1`, `-inf`) or is a symbolic dimension's minus (`S - T`)
            '-' if !starts_negative_number(&lx) => {
                lx.bump();
                Tok::Punct('-')
            }
            '-' | '0'..='9' => number(&mut lx).map_err(fail)?,
            c if c.is_ascii_alphabetic() || c == '_' => Tok::Ident(lx.take_while(is_name_char)),
            c => return Err(fail(format!("unexpected character '{c}'"))),
        };
        out.push(Token { tok, line, col });
    }
}

/// Whether the `-` at the lexer's position begins a number: `-` then a digit or `inf`.
fn starts_negative_number(lx: &Lexer) -> bool {
    let mut rest = lx.chars.clone();
    rest.next();
    let word: String = rest.take_while(|&c| is_name_char(c)).collect();
    word.starts_with(|c: char| c.is_ascii_digit()) || word == "inf"
}

fn string_body(lx: &mut Lexer) -> Result<String, String> {
    let mut s = String::new();
    loop {
        match lx.bump() {
            None | Some('\n') => return Err("unterminated string: expected '\"'".into()),
            Some('"') => return Ok(s),
            Some('\\') => match lx.bump() {
                Some('n') => s.push('\n'),
                Some('t') => s.push('\t'),
                Some(c @ ('"' | '\\')) => s.push(c),
                other => {
                    return Err(format!(
                        "unknown escape '\\{}' in string",
                        other.map(String::from).unwrap_or_default()
                    ));
                }
            },
            Some(c) => s.push(c),
        }
    }
}

/// `[-]digits`, `[-]digits.digits([eE][+-]digits)`, `[-]digits[eE][+-]digits`, `-inf`.
fn number(lx: &mut Lexer) -> Result<Tok, String> {
    let mut s = String::new();
    if lx.peek() == Some('-') {
        lx.bump();
        s.push('-');
        if lx.peek().is_some_and(|c| c.is_ascii_alphabetic()) {
            let word = lx.take_while(is_name_char);
            return match word.as_str() {
                "inf" => Ok(Tok::Float(f64::NEG_INFINITY)),
                _ => Err(format!("expected a number after '-', found '{word}'")),
            };
        }
    }
    let int_part = lx.take_while(|c| c.is_ascii_digit());
    if int_part.is_empty() {
        return Err("expected a number after '-'".into());
    }
    s.push_str(&int_part);
    let mut is_float = false;
    if lx.peek() == Some('.') {
        lx.bump();
        let frac = lx.take_while(|c| c.is_ascii_digit());
        if frac.is_empty() {
            return Err(format!("expected digits after '{s}.'"));
        }
        s.push('.');
        s.push_str(&frac);
        is_float = true;
    }
    if matches!(lx.peek(), Some('e' | 'E')) {
        lx.bump();
        s.push('e');
        if let Some(sign @ ('+' | '-')) = lx.peek() {
            lx.bump();
            s.push(sign);
        }
        let exp = lx.take_while(|c| c.is_ascii_digit());
        if exp.is_empty() {
            return Err(format!("expected exponent digits in '{s}'"));
        }
        s.push_str(&exp);
        is_float = true;
    }
    if lx
        .peek()
        .is_some_and(|c| c.is_ascii_alphabetic() || c == '_')
    {
        let rest = lx.take_while(is_name_char);
        return Err(format!("malformed number '{s}{rest}'"));
    }
    if is_float {
        s.parse::<f64>()
            .map(Tok::Float)
            .map_err(|_| format!("malformed number '{s}'"))
    } else {
        s.parse::<i64>()
            .map(Tok::Int)
            .map_err(|_| format!("integer {s} does not fit in 64 bits"))
    }
}
