//! A corpus job's texts, streamed from its input file: `.txt` (a text a line),
//! `.jsonl` (a JSON object a line, the text in one of its fields) or `.parquet` (the
//! text a string column). Row ids are the lines' (or rows') 0-based numbers.

use std::fs::File;
use std::io::{BufRead, BufReader, Read};
use std::path::{Path, PathBuf};

use anyhow::{bail, Context, Result};
use parquet::basic::{ConvertedType, LogicalType};
use parquet::file::reader::{FileReader, SerializedFileReader};
use parquet::record::reader::RowIter;
use parquet::record::Field;
use parquet::schema::types::Type;

/// The longest line read: one text far past any model's context, well under memory.
const MAX_LINE: u64 = 16 << 20;

/// How the input's lines hold their texts.
#[derive(Clone, Debug, PartialEq)]
pub enum Format {
    /// a text a line
    Lines,
    /// a JSON object a line, the text its string field of this name
    Jsonl(String),
    /// a Parquet file, the text its string column of this name
    Parquet(String),
}

impl Format {
    /// The format `path`'s extension names (`.txt`, `.jsonl` or `.ndjson`), with
    /// `--text-field` (only for JSON lines; "text" when not given).
    pub fn of(path: &Path, text_field: Option<&str>) -> Result<Format> {
        let ext = path.extension().and_then(|e| e.to_str()).unwrap_or("");
        match (ext, text_field) {
            ("txt", None) => Ok(Format::Lines),
            ("txt", Some(_)) => bail!(
                "--text-field: --input {} is a text a line (.txt), it has no fields",
                path.display()
            ),
            ("jsonl" | "ndjson", field) => Ok(Format::Jsonl(field.unwrap_or("text").into())),
            ("parquet", field) => Ok(Format::Parquet(field.unwrap_or("text").into())),
            _ => bail!(
                "--input {}: a corpus job reads .txt (a text a line), .jsonl (a JSON object a line) or .parquet (a string column; --text-field names it in both)",
                path.display()
            ),
        }
    }
}

/// The input's texts in order.
pub struct Texts {
    path: PathBuf,
    format: Format,
    source: Source,
    /// lines (or rows) read so far
    line: u64,
}

/// Where the texts come from.
enum Source {
    Lines(BufReader<File>),
    /// the rows of the text column alone
    Rows(RowIter<'static>),
}

impl Texts {
    pub fn open(path: &Path, format: Format) -> Result<Texts> {
        let name = || format!("--input {}", path.display());
        let file = File::open(path).with_context(name)?;
        let source = match &format {
            Format::Parquet(column) => {
                let reader = SerializedFileReader::new(file).with_context(name)?;
                let column = text_column(&reader, column).with_context(name)?;
                let rows = RowIter::from_file_into(Box::new(reader));
                Source::Rows(rows.project(Some(column)).with_context(name)?)
            }
            _ => Source::Lines(BufReader::with_capacity(1 << 20, file)),
        };
        Ok(Texts {
            path: path.into(),
            format,
            source,
            line: 0,
        })
    }

    /// The next line without its line break (a Parquet row's text), or `None` at the end.
    fn next_line(&mut self) -> Result<Option<String>> {
        let at = self.line + 1;
        let reader = match &mut self.source {
            Source::Lines(reader) => reader,
            Source::Rows(rows) => {
                let Some(row) = rows.next() else {
                    return Ok(None);
                };
                let row =
                    row.with_context(|| format!("--input {} row {at}", self.path.display()))?;
                self.line = at;
                return match row.get_column_iter().next() {
                    Some((_, Field::Str(text))) => Ok(Some(text.clone())),
                    _ => bail!(
                        "--input {} row {at}: no text (a null?)",
                        self.path.display()
                    ),
                };
            }
        };
        let mut buf = String::new();
        let read = reader
            .take(MAX_LINE + 1)
            .read_line(&mut buf)
            .with_context(|| format!("--input {} line {at}", self.path.display()))?;
        if read == 0 {
            return Ok(None);
        }
        if buf.len() as u64 > MAX_LINE {
            bail!(
                "--input {} line {at}: longer than {} MiB",
                self.path.display(),
                MAX_LINE >> 20
            );
        }
        self.line = at;
        if buf.ends_with('\n') {
            buf.pop();
            if buf.ends_with('\r') {
                buf.pop();
            }
        }
        Ok(Some(buf))
    }

    /// Passes over the next `n` lines without reading their texts; the lines there were.
    pub fn skip(&mut self, n: u64) -> Result<u64> {
        for skipped in 0..n {
            if self.next_line()?.is_none() {
                return Ok(skipped);
            }
        }
        Ok(n)
    }

    /// The next text, or `None` at the end.
    pub fn next_text(&mut self) -> Result<Option<String>> {
        let Some(line) = self.next_line()? else {
            return Ok(None);
        };
        let Format::Jsonl(field) = &self.format else {
            return Ok(Some(line));
        };
        let at = || format!("--input {} line {}", self.path.display(), self.line);
        let value: serde_json::Value =
            serde_json::from_str(&line).with_context(|| format!("{}: not JSON", at()))?;
        match value.get(field.as_str()) {
            Some(serde_json::Value::String(text)) => Ok(Some(text.clone())),
            Some(_) => bail!("{}: field `{field}` is not a string", at()),
            None => bail!("{}: no field `{field}` (--text-field)", at()),
        }
    }

    /// Texts in the file at `path` (the progress bar's end): a Parquet file's rows from
    /// its footer, otherwise its lines, by one pass over its bytes.
    pub fn count(path: &Path, format: &Format) -> Result<u64> {
        let mut file = File::open(path).with_context(|| format!("--input {}", path.display()))?;
        if let Format::Parquet(_) = format {
            let reader = SerializedFileReader::new(file)
                .with_context(|| format!("--input {}", path.display()))?;
            return Ok(reader.metadata().file_metadata().num_rows().max(0) as u64);
        }
        let (mut lines, mut last) = (0u64, b'\n');
        let mut buf = vec![0u8; 1 << 20];
        loop {
            let n = file
                .read(&mut buf)
                .with_context(|| format!("--input {}", path.display()))?;
            if n == 0 {
                break;
            }
            lines += buf[..n].iter().filter(|&&b| b == b'\n').count() as u64;
            last = buf[n - 1];
        }
        // a last line without its line break counts too
        Ok(lines + u64::from(last != b'\n'))
    }
}

/// The file's top-level string column `name`, as a projection of its schema.
fn text_column(reader: &SerializedFileReader<File>, name: &str) -> Result<Type> {
    let schema = reader.metadata().file_metadata().schema();
    let Some(field) = schema.get_fields().iter().find(|f| f.name() == name) else {
        let names: Vec<&str> = schema.get_fields().iter().map(|f| f.name()).collect();
        bail!("no column `{name}` (--text-field) among {names:?}");
    };
    let info = field.get_basic_info();
    let string = field.is_primitive()
        && field.get_physical_type() == parquet::basic::Type::BYTE_ARRAY
        && (matches!(info.logical_type_ref(), Some(LogicalType::String))
            || info.converted_type() == ConvertedType::UTF8);
    if !string {
        bail!("column `{name}` is not a string column (--text-field)");
    }
    Ok(Type::group_type_builder(schema.name())
        .with_fields(vec![field.clone()])
        .build()?)
}
