//! llama.cpp's grammar format (GBNF) read into the Lark dialect the grammar engine
//! takes, so that a grammar written for llama-server (its `grammar` field, its
//! `grammars/*.gbnf`) constrains qkv's output the same way.
//!
//! GBNF: `name ::= alternatives`, strings `"…"`, character classes `[a-z]`, `[^"\\]`,
//! `.` for any character, groups, `|`, `*` `+` `?` and `{m}` `{m,}` `{m,n}`, `#`
//! comments; `root` is where it starts. Each rule becomes a Lark rule (`r_` and its name,
//! `-` as `_`), each string a group of one-character Lark strings, each class or `.` a
//! one-character regex: GBNF matches character by character, and so then does the
//! engine (its lexer would otherwise take a keyword's whole string where GBNF also
//! follows an identifier that starts with it). `tests/gbnf.rs` holds the verdicts to
//! llama.cpp's own on its grammar files.

use crate::error::{Error, Result};

/// The Lark grammar of a GBNF one.
pub fn to_lark(gbnf: &str) -> Result<String> {
    let mut r = Reader {
        src: gbnf.as_bytes(),
        text: gbnf,
        at: 0,
    };
    let mut out = String::from("start: r_root\n");
    let mut rules = 0;
    loop {
        r.space(true);
        if r.done() {
            break;
        }
        let name = r.name()?;
        r.space(true);
        if !r.eat("::=") {
            return Err(r.error(&format!("`::=` after the rule name `{name}`")));
        }
        out.push_str(&format!("{}: ", rule(&name)));
        r.alternatives(&mut out, false)?;
        out.push('\n');
        rules += 1;
    }
    if rules == 0 {
        return Err(Error::invalid("grammar", "the GBNF grammar has no rule"));
    }
    if !gbnf_defines_root(gbnf) {
        return Err(Error::invalid(
            "grammar",
            "the GBNF grammar has no `root` rule",
        ));
    }
    Ok(out)
}

/// Whether a rule named `root` is defined (a line starting `root ::=`).
fn gbnf_defines_root(gbnf: &str) -> bool {
    gbnf.lines().any(|l| {
        l.trim_start()
            .strip_prefix("root")
            .is_some_and(|rest| rest.trim_start().starts_with("::="))
    })
}

/// A GBNF rule's name in Lark.
fn rule(name: &str) -> String {
    format!("r_{}", name.to_lowercase().replace('-', "_"))
}

struct Reader<'a> {
    src: &'a [u8],
    text: &'a str,
    at: usize,
}

impl Reader<'_> {
    fn done(&self) -> bool {
        self.at >= self.src.len()
    }

    fn peek(&self) -> Option<u8> {
        self.src.get(self.at).copied()
    }

    fn eat(&mut self, s: &str) -> bool {
        let hit = self.src[self.at..].starts_with(s.as_bytes());
        if hit {
            self.at += s.len();
        }
        hit
    }

    fn error(&self, expected: &str) -> Error {
        let line = self.text[..self.at.min(self.text.len())]
            .matches('\n')
            .count()
            + 1;
        Error::invalid("grammar", format!("GBNF line {line}: expected {expected}"))
    }

    /// Skips spaces and comments; newlines too when `newlines` (between rules, and
    /// inside groups).
    fn space(&mut self, newlines: bool) {
        while let Some(c) = self.peek() {
            match c {
                b' ' | b'\t' | b'\r' => self.at += 1,
                b'\n' if newlines => self.at += 1,
                b'#' => {
                    while self.peek().is_some_and(|c| c != b'\n') {
                        self.at += 1;
                    }
                }
                _ => return,
            }
        }
    }

    fn name(&mut self) -> Result<String> {
        let start = self.at;
        while self
            .peek()
            .is_some_and(|c| c.is_ascii_alphanumeric() || c == b'-' || c == b'_')
        {
            self.at += 1;
        }
        match self.at > start {
            true => Ok(self.text[start..self.at].to_string()),
            false => Err(self.error("a rule name")),
        }
    }

    /// Whether a new rule starts here (`name ::=`), ending the one before.
    fn at_rule_start(&self) -> bool {
        let rest = &self.text[self.at..];
        let name = rest
            .bytes()
            .take_while(|c| c.is_ascii_alphanumeric() || *c == b'-' || *c == b'_')
            .count();
        name > 0
            && rest[name..]
                .trim_start_matches([' ', '\t'])
                .starts_with("::=")
    }

    /// `a b | c d …` up to the end of the rule (or the group's `)`).
    fn alternatives(&mut self, out: &mut String, nested: bool) -> Result<()> {
        let mut first = true;
        loop {
            // a rule goes on past a newline while the next line does not start a rule
            self.space(true);
            if self.done() || (!nested && self.at_rule_start()) || self.peek() == Some(b')') {
                if first {
                    return Err(self.error("an alternative"));
                }
                return Ok(());
            }
            if self.eat("|") {
                out.push_str(" | ");
                continue;
            }
            first = false;
            self.item(out)?;
            out.push(' ');
        }
    }

    /// One item and its repetition.
    fn item(&mut self, out: &mut String) -> Result<()> {
        match self.peek() {
            Some(b'"') => {
                self.at += 1;
                let s = self.chars_until(b'"')?;
                let quoted = |c: char| serde_json::to_string(&c.to_string()).expect("a string");
                match s.chars().count() {
                    0 => out.push_str("\"\""),
                    1 => out.extend(s.chars().map(quoted)),
                    // one character a terminal: the lexer takes its longest match, and a
                    // whole-string terminal (`"while"`) would win over an identifier
                    // that goes on (`whilex`), where GBNF keeps both paths
                    _ => {
                        let chars: Vec<String> = s.chars().map(quoted).collect();
                        out.push_str(&format!("({})", chars.join(" ")));
                    }
                }
            }
            Some(b'[') => {
                self.at += 1;
                let negated = self.eat("^");
                let class = self.class()?;
                out.push_str(&format!("/[{}{class}]/", if negated { "^" } else { "" }));
            }
            Some(b'.') => {
                self.at += 1;
                out.push_str("/(?s:.)/");
            }
            Some(b'(') => {
                self.at += 1;
                out.push('(');
                self.alternatives(out, true)?;
                if !self.eat(")") {
                    return Err(self.error("`)`"));
                }
                out.push(')');
            }
            Some(c) if c.is_ascii_alphanumeric() || c == b'-' || c == b'_' => {
                let name = self.name()?;
                out.push_str(&rule(&name));
            }
            _ => return Err(self.error("a string, a class, a rule name or a group")),
        }
        match self.peek() {
            Some(c @ (b'*' | b'+' | b'?')) => {
                self.at += 1;
                out.push(c as char);
            }
            Some(b'{') => {
                let end = self.text[self.at..]
                    .find('}')
                    .ok_or_else(|| self.error("`}`"))?;
                let body = &self.text[self.at + 1..self.at + end];
                if !body
                    .bytes()
                    .all(|c| c.is_ascii_digit() || c == b',' || c == b' ')
                {
                    return Err(self.error("a repetition `{m}`, `{m,}` or `{m,n}`"));
                }
                out.push_str(&format!("{{{}}}", body.replace(' ', "")));
                self.at += end + 1;
            }
            _ => {}
        }
        Ok(())
    }

    /// The characters of a string up to its closing `end`, escapes decoded.
    fn chars_until(&mut self, end: u8) -> Result<String> {
        let mut s = String::new();
        loop {
            match self.peek() {
                None => return Err(self.error(&format!("a closing `{}`", end as char))),
                Some(c) if c == end => {
                    self.at += 1;
                    return Ok(s);
                }
                Some(_) => s.push(self.char()?),
            }
        }
    }

    /// One character, an escape decoded.
    fn char(&mut self) -> Result<char> {
        let rest = &self.text[self.at..];
        let c = rest
            .chars()
            .next()
            .ok_or_else(|| self.error("a character"))?;
        if c != '\\' {
            self.at += c.len_utf8();
            return Ok(c);
        }
        let e = rest[1..]
            .chars()
            .next()
            .ok_or_else(|| self.error("an escape"))?;
        let hex = |digits: usize| -> Result<(char, usize)> {
            let code = rest
                .get(2..2 + digits)
                .and_then(|h| u32::from_str_radix(h, 16).ok())
                .and_then(char::from_u32)
                .ok_or_else(|| self.error(&format!("{digits} hex digits after `\\{e}`")))?;
            Ok((code, 2 + digits))
        };
        let (c, len) = match e {
            'n' => ('\n', 2),
            't' => ('\t', 2),
            'r' => ('\r', 2),
            'x' => hex(2)?,
            'u' => hex(4)?,
            'U' => hex(8)?,
            other => (other, 1 + other.len_utf8()),
        };
        self.at += len;
        Ok(c)
    }

    /// A class's members up to its `]`, as a regex class's (escaped for the regex and
    /// for Lark's `/…/`).
    fn class(&mut self) -> Result<String> {
        let mut out = String::new();
        loop {
            match self.peek() {
                None => return Err(self.error("a closing `]`")),
                Some(b']') => {
                    self.at += 1;
                    return Ok(out);
                }
                Some(b'-') if !out.is_empty() && self.src.get(self.at + 1) != Some(&b']') => {
                    self.at += 1;
                    out.push('-');
                }
                Some(_) => {
                    let c = self.char()?;
                    match c {
                        '\\' | ']' | '[' | '^' | '-' | '/' | '&' | '~' => {
                            out.push('\\');
                            out.push(c);
                        }
                        '\n' => out.push_str("\\n"),
                        '\t' => out.push_str("\\t"),
                        '\r' => out.push_str("\\r"),
                        c => out.push(c),
                    }
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rules_strings_classes_and_repetitions_read_as_lark() {
        let lark = to_lark(
            "# a comment\nroot ::= \"a\\n\" item-list{1,3} [^\"\\\\]* ( x | \"y\" )?\nitem-list ::= [a-z0-9-]+\n  | .\nx ::= \"\\x41\"",
        )
        .unwrap();
        assert_eq!(
            lark,
            "start: r_root\nr_root: (\"a\" \"\\n\") r_item_list{1,3} /[^\"\\\\]/* (r_x  | \"y\" )? \nr_item_list: /[a-z0-9\\-]/+  | /(?s:.)/ \nr_x: \"A\" \n"
        );
    }

    #[test]
    fn broken_grammars_name_the_line() {
        let e = to_lark("root ::= \"a\"\nb ::= [a-z")
            .unwrap_err()
            .to_string();
        assert!(e.contains("line 2") && e.contains("`]`"), "{e}");
        assert!(to_lark("item ::= \"a\"")
            .unwrap_err()
            .to_string()
            .contains("root"));
        assert!(to_lark("# nothing").is_err());
    }
}
