//! Plain-text tables for the terminal. Columns are padded to their widest cell, counting
//! CJK characters as two columns because terminals draw 狗 twice as wide as `a`.
//! A column whose body cells are all numbers is right-aligned.

use std::io::{self, Write};

pub struct Table {
    header: Vec<String>,
    rows: Vec<Vec<String>>,
}

impl Table {
    pub fn new(header: &[&str]) -> Self {
        Table {
            header: header.iter().map(|h| h.to_string()).collect(),
            rows: Vec::new(),
        }
    }

    /// Appends a row; it must have as many cells as the header.
    pub fn row(&mut self, cells: Vec<String>) {
        debug_assert_eq!(cells.len(), self.header.len(), "table row width");
        self.rows.push(cells);
    }

    pub fn write(&self, out: &mut dyn Write) -> io::Result<()> {
        let columns = self.header.len();
        let widths: Vec<usize> = (0..columns)
            .map(|c| {
                let body = self.rows.iter().map(|r| display_width(&r[c]));
                body.fold(display_width(&self.header[c]), usize::max)
            })
            .collect();
        let numeric: Vec<bool> = (0..columns)
            .map(|c| self.rows.iter().all(|r| r[c].parse::<f64>().is_ok()))
            .collect();
        let rule: Vec<String> = widths.iter().map(|&w| "-".repeat(w)).collect();
        for cells in std::iter::once(&self.header)
            .chain(std::iter::once(&rule))
            .chain(&self.rows)
        {
            let padded: Vec<String> = cells
                .iter()
                .enumerate()
                .map(|(c, cell)| pad(cell, widths[c], numeric[c]))
                .collect();
            writeln!(out, "  {}", padded.join("  ").trim_end())?;
        }
        Ok(())
    }
}

fn pad(cell: &str, width: usize, right: bool) -> String {
    let fill = " ".repeat(width.saturating_sub(display_width(cell)));
    if right {
        format!("{fill}{cell}")
    } else {
        format!("{cell}{fill}")
    }
}

/// Terminal columns taken by `s`: two for East Asian wide characters, one otherwise.
fn display_width(s: &str) -> usize {
    s.chars().map(|c| if is_wide(c) { 2 } else { 1 }).sum()
}

fn is_wide(c: char) -> bool {
    matches!(c,
        '\u{1100}'..='\u{115F}'     // Hangul Jamo
        | '\u{2E80}'..='\u{A4CF}'   // CJK radicals, punctuation, kana, ideographs, Yi
        | '\u{AC00}'..='\u{D7A3}'   // Hangul syllables
        | '\u{F900}'..='\u{FAFF}'   // CJK compatibility ideographs
        | '\u{FE30}'..='\u{FE4F}'   // CJK compatibility forms
        | '\u{FF00}'..='\u{FF60}'   // full-width forms
        | '\u{FFE0}'..='\u{FFE6}')
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn wide_characters_count_twice() {
        assert_eq!(display_width("狗咬人"), 6);
        assert_eq!(display_width("a 狗"), 4);
    }

    #[test]
    fn columns_line_up() {
        let mut t = Table::new(&["token", "x"]);
        t.row(vec!["狗".into(), "1.5".into()]);
        t.row(vec!["dog".into(), "-10.25".into()]);
        let mut buf = Vec::new();
        t.write(&mut buf).unwrap();
        let text = String::from_utf8(buf).unwrap();
        let lines: Vec<&str> = text.lines().collect();
        assert_eq!(lines[2], "  狗        1.5");
        assert_eq!(lines[3], "  dog    -10.25");
    }
}
