//! A corpus job's output folder: the job's description (`_qkv_job.json`) and its
//! results in parts of `chunk` rows, `part-000000.parquet`, … Each part is written
//! beside its final name (`.part-000000.parquet.tmp`) and renamed when whole, so a
//! killed job leaves whole parts only, and `--resume` goes on after the last one.
//! Parquet readers (pyarrow, Spark, Ray Data, DuckDB, pandas) read the folder as one
//! table: they skip names that begin with `_` or `.`.
//!
//! A part holds `id` (int64: the input's line number, from 0) and the job's results:
//! `embedding` (list<float>: the schema Arrow writes for a list of f32 vectors), or a
//! classifier's `label` (string: the top label), `score` (float: its score) and
//! `scores` (list<float>: every label's, in the model's label order).

use std::fs::{self, File};
use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use anyhow::{bail, Context, Result};
use parquet::data_type::{ByteArray, ByteArrayType, FloatType, Int64Type};
use parquet::file::properties::WriterProperties;
use parquet::file::writer::SerializedColumnWriter;
use parquet::file::writer::SerializedFileWriter;
use parquet::schema::parser::parse_message_type;
use serde_json::Value;

/// The job description's file name.
const JOB_FILE: &str = "_qkv_job.json";

/// An embedding part's schema, in Parquet's message notation.
const EMBEDDINGS: &str = "message embeddings {
    required int64 id;
    required group embedding (LIST) {
        repeated group list {
            required float element;
        }
    }
}";

/// A classification part's schema.
const CLASSES: &str = "message classes {
    required int64 id;
    required binary label (STRING);
    required float score;
    required group scores (LIST) {
        repeated group list {
            required float element;
        }
    }
}";

/// One chunk's results, a row a text.
pub enum Results {
    Embeddings(Vec<Vec<f32>>),
    /// the top label and its score, and every label's score
    Classes(Vec<(String, f32, Vec<f32>)>),
}

impl Results {
    fn rows(&self) -> usize {
        match self {
            Results::Embeddings(v) => v.len(),
            Results::Classes(c) => c.len(),
        }
    }
}

/// An output folder, ready for parts.
pub struct Parts {
    dir: PathBuf,
}

impl Parts {
    /// A new job's folder (made, or an empty one) holding `job`; with `resume`, a
    /// folder this same job wrote before. Returns it and the parts it already has.
    pub fn open(dir: &Path, job: &Value, resume: bool) -> Result<(Parts, u64)> {
        let name = dir.display();
        let parts = Parts { dir: dir.into() };
        let description = dir.join(JOB_FILE);
        if !resume {
            let used = fs::read_dir(dir).map(|mut d| d.next().is_some());
            if used.unwrap_or(false) {
                bail!("--output {name} is not empty: --resume continues the job that wrote it");
            }
            fs::create_dir_all(dir).with_context(|| format!("--output {name}"))?;
            let text = serde_json::to_string_pretty(job)?;
            parts.write_whole(&description, text.as_bytes())?;
            return Ok((parts, 0));
        }
        let text = fs::read_to_string(&description).with_context(|| {
            format!(
                "--resume: {} (a qkv corpus job's output?)",
                description.display()
            )
        })?;
        let before: Value = serde_json::from_str(&text)
            .with_context(|| format!("--resume: {}", description.display()))?;
        for (key, now) in job.as_object().into_iter().flatten() {
            if before.get(key) != Some(now) {
                bail!(
                    "--resume: {name} holds another job's results: its {key} was {}, this one's is {now}",
                    before.get(key).unwrap_or(&Value::Null)
                );
            }
        }
        // a part killed while it was written
        for entry in fs::read_dir(dir).with_context(|| format!("--output {name}"))? {
            let path = entry?.path();
            let file = path.file_name().and_then(|n| n.to_str()).unwrap_or("");
            if file.starts_with(".part-") && file.ends_with(".tmp") {
                fs::remove_file(&path).with_context(|| format!("{}", path.display()))?;
            }
        }
        let mut done = 0;
        while parts.path(done).exists() {
            done += 1;
        }
        Ok((parts, done))
    }

    /// Part `index`'s final name.
    fn path(&self, index: u64) -> PathBuf {
        self.dir.join(format!("part-{index:06}.parquet"))
    }

    /// Writes `bytes` to `path` through a temporary beside it.
    fn write_whole(&self, path: &Path, bytes: &[u8]) -> Result<()> {
        let tmp = path.with_extension("tmp");
        let mut file = File::create(&tmp).with_context(|| format!("{}", tmp.display()))?;
        file.write_all(bytes)
            .with_context(|| format!("{}", tmp.display()))?;
        self.settle(file, &tmp, path)
    }

    /// Gives the whole temporary `tmp` (its `file`) its final name `path`, durably: the
    /// bytes reach the disk before the name does, and the name before this returns. A
    /// machine that loses power can then leave a temporary behind, never a part that
    /// `--resume` would count as whole while its bytes were lost.
    fn settle(&self, file: File, tmp: &Path, path: &Path) -> Result<()> {
        file.sync_all()
            .with_context(|| format!("{}", tmp.display()))?;
        drop(file);
        fs::rename(tmp, path).with_context(|| format!("{}", path.display()))?;
        // the rename is an entry of the folder: syncing the folder makes it durable
        File::open(&self.dir)
            .and_then(|d| d.sync_all())
            .with_context(|| format!("{}", self.dir.display()))
    }

    /// Writes part `index`: rows `first_id..` with their results.
    pub fn write(&self, index: u64, first_id: u64, results: &Results) -> Result<()> {
        let path = self.path(index);
        let tmp = self.dir.join(format!(".part-{index:06}.parquet.tmp"));
        let ids: Vec<i64> = (0..results.rows() as i64)
            .map(|i| first_id as i64 + i)
            .collect();
        let schema = match results {
            Results::Embeddings(_) => EMBEDDINGS,
            Results::Classes(_) => CLASSES,
        };
        let schema = Arc::new(parse_message_type(schema)?);
        let properties = Arc::new(WriterProperties::builder().build());
        let file = File::create(&tmp).with_context(|| format!("{}", tmp.display()))?;
        let written = (|| -> parquet::errors::Result<File> {
            let mut writer = SerializedFileWriter::new(file, schema, properties)?;
            let mut group = writer.next_row_group()?;
            let mut column = 0;
            while let Some(mut col) = group.next_column()? {
                match (column, results) {
                    (0, _) => {
                        col.typed::<Int64Type>().write_batch(&ids, None, None)?;
                    }
                    (_, Results::Embeddings(vectors)) => write_lists(&mut col, vectors)?,
                    (1, Results::Classes(rows)) => {
                        let labels: Vec<ByteArray> = rows
                            .iter()
                            .map(|r| r.0.as_bytes().to_vec().into())
                            .collect();
                        col.typed::<ByteArrayType>()
                            .write_batch(&labels, None, None)?;
                    }
                    (2, Results::Classes(rows)) => {
                        let scores: Vec<f32> = rows.iter().map(|r| r.1).collect();
                        col.typed::<FloatType>().write_batch(&scores, None, None)?;
                    }
                    (_, Results::Classes(rows)) => {
                        let lists: Vec<&[f32]> = rows.iter().map(|r| r.2.as_slice()).collect();
                        write_lists(&mut col, &lists)?;
                    }
                }
                col.close()?;
                column += 1;
            }
            group.close()?;
            writer.into_inner()
        })();
        let file = written.with_context(|| format!("{}", tmp.display()))?;
        self.settle(file, &tmp, &path)
    }
}

/// Writes a required list<float> column, a list a row.
fn write_lists(
    col: &mut SerializedColumnWriter<'_>,
    lists: &[impl AsRef<[f32]>],
) -> parquet::errors::Result<()> {
    let values: Vec<f32> = lists.iter().flat_map(|v| v.as_ref()).copied().collect();
    // every element is there (definition level 1); each row's first element starts
    // a new list (repetition level 0), the others go on in it (1)
    let defined = vec![1i16; values.len()];
    let repeated: Vec<i16> = lists
        .iter()
        .flat_map(|v| (0..v.as_ref().len()).map(|j| i16::from(j > 0)))
        .collect();
    col.typed::<FloatType>()
        .write_batch(&values, Some(&defined), Some(&repeated))?;
    Ok(())
}
