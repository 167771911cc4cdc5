//! A model folder's tokenizer, read by Hugging Face's own `tokenizers` crate (pure-Rust
//! regex backend), with batch encoding into a padded [`TokenBatch`]: `tokenizer.json`
//! where the folder has one, else SentencePiece files, converted for that crate as
//! transformers' slow→fast converter does: Marian's `source.spm` / `target.spm` with
//! `vocab.json`, or T5's `spiece.model`.

use std::collections::HashSet;
use std::path::{Path, PathBuf};

use tokenizers::PostProcessor;

use crate::batch::TokenBatch;
use crate::error::{Error, Result};
use crate::text::guards;
use crate::text::labels::{label_tokens, TokenLabel};
use crate::text::marian::{self, MarianVocab};
use crate::text::sentencepiece;
use crate::text::token_bytes::Spelling;

/// See [`Tokenizer::stream`].
pub struct TextStream<'a> {
    tokenizer: &'a Tokenizer,
    ids: Vec<usize>,
    /// The text given out so far: always a prefix of the decoded `ids`.
    shown: String,
    /// How many of `ids` `shown` is the text of.
    shown_ids: usize,
}

impl TextStream<'_> {
    /// The text `id` completes, if any: none while the text ends inside a character
    /// (a byte token holding part of one) or the token adds no text (a special token).
    pub fn push(&mut self, id: usize) -> Result<Option<String>> {
        self.ids.push(id);
        let text = self.tokenizer.decode(&self.ids)?;
        if text.ends_with(char::REPLACEMENT_CHARACTER) {
            return Ok(None);
        }
        let new = self.advance(&text).ok_or_else(|| {
            Error::Tokenizer(format!(
                "{}: token {id} changes text already shown ({:?} is now {text:?}); this tokenizer's decoder cannot stream",
                self.tokenizer.path.display(),
                self.shown
            ))
        })?;
        self.shown = text;
        self.shown_ids = self.ids.len();
        Ok((!new.is_empty()).then_some(new))
    }

    /// The rest of the text once the last token is in: what [`TextStream::push`] held
    /// back, an incomplete character shown as `decode` shows it (U+FFFD). Byte
    /// fallback decodes a run of byte tokens together, so an incomplete character at
    /// the end turns the whole run into U+FFFD, including characters already shown;
    /// the rest is then the held-back tokens' own text.
    pub fn finish(self) -> Result<Option<String>> {
        let text = self.tokenizer.decode(&self.ids)?;
        let rest = match self.advance(&text) {
            Some(rest) => rest,
            None => self.tokenizer.decode(&self.ids[self.shown_ids..])?,
        };
        Ok((!rest.is_empty()).then_some(rest))
    }

    /// What `text`, the decoding of every id so far, adds to the text shown; `None`
    /// when it changes text already shown.
    fn advance(&self, text: &str) -> Option<String> {
        text.strip_prefix(self.shown.as_str()).map(str::to_string)
    }
}

pub struct Tokenizer {
    /// for a Marian folder: the source model, whose pieces `marian` numbers
    inner: tokenizers::Tokenizer,
    path: PathBuf,
    marian: Option<MarianVocab>,
    /// trim the decoded text's ends, as transformers' slow `T5Tokenizer` does
    trim_decoded: bool,
}

impl Tokenizer {
    /// The folder's tokenizer when it has one (`None` when it has no `tokenizer.json`,
    /// Marian `source.spm` or `spiece.model`; for a GGUF file, the one in its metadata); a
    /// file that is there but unreadable is an error, not a silent fallback to ids.
    pub fn optional(dir: &Path) -> Result<Option<Self>> {
        if crate::io::gguf::is_gguf(dir) {
            return Self::from_gguf(dir);
        }
        let any = ["tokenizer.json", "source.spm", "spiece.model"]
            .iter()
            .any(|f| dir.join(f).exists());
        match any {
            true => Tokenizer::from_dir(dir).map(Some),
            false => Ok(None),
        }
    }

    /// Loads the folder's tokenizer: `tokenizer.json`, else Marian's `source.spm`,
    /// `target.spm` and `vocab.json`, else T5's `spiece.model`; a GGUF file's from its
    /// metadata. A folder with none of them is an error that says so and points at
    /// `--input-ids`.
    pub fn from_dir(dir: &Path) -> Result<Self> {
        if crate::io::gguf::is_gguf(dir) {
            return Self::from_gguf(dir)?.ok_or_else(|| {
                Error::Tokenizer(format!(
                    "{}: the file's metadata holds no tokenizer (`tokenizer.ggml.model`); pass token ids with --input-ids instead",
                    dir.display()
                ))
            });
        }
        let path = dir.join("tokenizer.json");
        if !path.is_file() {
            if dir.join("source.spm").is_file() {
                return Tokenizer::marian(dir);
            }
            if dir.join("spiece.model").is_file() {
                return Tokenizer::t5_spiece(dir);
            }
            return Err(Error::Tokenizer(format!(
                "{} not found: this folder has no tokenizer (tokenizer.json, Marian's source.spm with vocab.json, or T5's spiece.model); pass token ids with --input-ids instead",
                path.display()
            )));
        }
        let bytes = crate::io::read_regular(&path)?;
        let refuse = |why: String| Error::Tokenizer(format!("{}: {why}", path.display()));
        let file: serde_json::Value =
            serde_json::from_slice(&bytes).map_err(|e| refuse(format!("not valid JSON: {e}")))?;
        Self::from_json(&file, &bytes, path)
    }

    /// The tokenizer a GGUF file's metadata holds (`text/gguf_vocab.rs`), `None` when the file
    /// has no vocabulary.
    pub fn from_gguf(path: &Path) -> Result<Option<Self>> {
        let file = crate::io::gguf::GgufFile::open(path)?;
        let refuse = |why: String| Error::Tokenizer(format!("{}: {why}", path.display()));
        let Some(json) = super::gguf_vocab::tokenizer_json(&file.header).map_err(refuse)? else {
            return Ok(None);
        };
        let bytes = serde_json::to_vec(&json).map_err(|e| refuse(e.to_string()))?;
        Self::from_json(&json, &bytes, path.to_path_buf()).map(Some)
    }

    /// The tokenizer of `file`, a `tokenizer.json` (`bytes` its text) read from `path`,
    /// past the guards.
    fn from_json(file: &serde_json::Value, bytes: &[u8], path: PathBuf) -> Result<Self> {
        let refuse = |why: String| Error::Tokenizer(format!("{}: {why}", path.display()));
        guards::before_load(file).map_err(refuse)?;
        let mut inner =
            tokenizers::Tokenizer::from_bytes(bytes).map_err(|e| refuse(e.to_string()))?;
        guards::after_load(&inner).map_err(refuse)?;
        // transformers overrides the file's padding and truncation on every call (a call
        // without those arguments does neither); some files carry them anyway, e.g.
        // all-MiniLM-L6-v2's pads every text to 128 with [PAD] that would count as real.
        inner.with_padding(None);
        inner
            .with_truncation(None)
            .map_err(|e| Error::Tokenizer(format!("{}: {e}", path.display())))?;
        Ok(Tokenizer {
            inner,
            path,
            marian: None,
            trim_decoded: false,
        })
    }

    /// An OPUS-MT folder (`text/marian.rs`).
    fn marian(dir: &Path) -> Result<Self> {
        let vocab = MarianVocab::read(dir)?;
        let path = dir.join("source.spm");
        let target = dir.join("target.spm");
        if !target.is_file() {
            return Err(Error::Tokenizer(format!(
                "{} not found: a Marian folder has source.spm and target.spm",
                target.display()
            )));
        }
        // read so that a broken target model is an error now, not at the first decode
        sentencepiece::read(&target)?.tokenizer(&target, None, &[])?;
        let source = sentencepiece::read(&path)?;
        // Marian's special tokens are split out of the text even where the source
        // model has no piece for them, as MarianTokenizer's added tokens are
        let extra: Vec<String> = marian::SPECIAL
            .iter()
            .filter(|t| source.id_of(t).is_none())
            .map(|t| t.to_string())
            .collect();
        Ok(Tokenizer {
            inner: source.tokenizer(&path, None, &extra)?,
            path,
            marian: Some(vocab),
            trim_decoded: false,
        })
    }

    /// A T5 folder with `spiece.model` alone, as transformers' slow `T5Tokenizer` reads
    /// it: `</s>` after the text, and `extra_ids` sentinel tokens `<extra_id_N>` after
    /// the pieces, the last id being `<extra_id_0>` (`tokenizer_config.json`; 100 when
    /// it does not say).
    fn t5_spiece(dir: &Path) -> Result<Self> {
        #[derive(serde::Deserialize)]
        struct Config {
            #[serde(default = "hundred")]
            extra_ids: usize,
        }
        fn hundred() -> usize {
            100
        }
        let config_path = dir.join("tokenizer_config.json");
        let extra_ids = match config_path.is_file() {
            true => crate::io::read_json::<Config>(&config_path)?.extra_ids,
            false => 100,
        };
        let path = dir.join("spiece.model");
        let model = sentencepiece::read(&path)?;
        let eos = model.id_of("</s>").ok_or_else(|| {
            Error::Tokenizer(format!(
                "{}: no `</s>` piece, which T5 appends to every text",
                path.display()
            ))
        })?;
        let extra: Vec<String> = (0..extra_ids)
            .rev()
            .map(|i| format!("<extra_id_{i}>"))
            .collect();
        Ok(Tokenizer {
            inner: model.tokenizer(&path, Some(eos_after(eos)), &extra)?,
            path,
            marian: None,
            trim_decoded: true,
        })
    }

    /// Token ids of one text, with the special tokens the tokenizer's post-processor
    /// adds (`[CLS] … [SEP]` for BERT) when `special` is true.
    pub fn encode(&self, text: &str, special: bool) -> Result<Vec<usize>> {
        if let Some(m) = &self.marian {
            return m.encode(&self.inner, text, special, None).map_err(|e| {
                Error::Tokenizer(format!("{}: encoding {text:?}: {e}", self.path.display()))
            });
        }
        let enc = self.inner.encode(text, special).map_err(|e| {
            Error::Tokenizer(format!("{}: encoding {text:?}: {e}", self.path.display()))
        })?;
        Ok(enc.get_ids().iter().map(|&i| i as usize).collect())
    }

    /// Token ids of one text cut to at most `max_len` ids, special tokens included: the
    /// text is cut first and the special tokens added after, so `[SEP]` survives, as
    /// transformers' `truncation=True, max_length=…` does.
    fn encode_truncated(&self, text: &str, special: bool, max_len: usize) -> Result<Vec<usize>> {
        if let Some(m) = &self.marian {
            return m
                .encode(&self.inner, text, special, Some(max_len))
                .map_err(|e| {
                    Error::Tokenizer(format!("{}: encoding {text:?}: {e}", self.path.display()))
                });
        }
        let err = |e| Error::Tokenizer(format!("{}: encoding {text:?}: {e}", self.path.display()));
        let mut enc = self.inner.encode(text, false).map_err(err)?;
        let added = match self.inner.get_post_processor() {
            Some(p) if special => p.added_tokens(false),
            _ => 0,
        };
        enc.truncate(
            max_len.saturating_sub(added),
            0,
            tokenizers::TruncationDirection::Right,
        );
        let enc = self.inner.post_process(enc, None, special).map_err(err)?;
        Ok(enc.get_ids().iter().map(|&i| i as usize).collect())
    }

    /// Encodes several texts into one right-padded batch (`pad_id` fills the gaps,
    /// masked out). Texts longer than `max_len`, if given, are truncated to it
    /// (special tokens kept).
    pub fn encode_batch(
        &self,
        texts: &[&str],
        special: bool,
        pad_id: usize,
        max_len: Option<usize>,
    ) -> Result<TokenBatch> {
        let rows = texts
            .iter()
            .map(|t| match max_len {
                Some(max) => self.encode_truncated(t, special, max),
                None => self.encode(t, special),
            })
            .collect::<Result<Vec<_>>>()?;
        let len = rows.iter().map(Vec::len).max().unwrap_or(0);
        let mut ids = Vec::with_capacity(rows.len() * len);
        let mut mask = Vec::with_capacity(rows.len() * len);
        for row in &rows {
            ids.extend(
                row.iter()
                    .copied()
                    .chain(std::iter::repeat_n(pad_id, len - row.len())),
            );
            mask.extend((0..len).map(|i| i < row.len()));
        }
        TokenBatch::new(ids, Some(mask), rows.len(), len)
    }

    /// Texts, or text pairs, as one right-padded batch with its segment ids `[B·T]`
    /// (0 on the first text, 1 on the second where the post-processor says so, as
    /// BERT's `[CLS] A [SEP] B [SEP]` does; 0 on padding). Each input is cut to `max_len`
    /// ids, special tokens included, longest text first, as transformers'
    /// `truncation=True` (`longest_first`) does for a pair.
    pub fn encode_pairs(
        &self,
        inputs: &[(&str, Option<&str>)],
        pad_id: usize,
        max_len: usize,
    ) -> Result<(TokenBatch, Vec<usize>)> {
        if self.marian.is_some() {
            return Err(Error::Tokenizer(format!(
                "{}: a Marian tokenizer encodes single texts, not pairs",
                self.path.display()
            )));
        }
        let rows = inputs
            .iter()
            .map(|&(a, b)| self.encode_pair(a, b, max_len))
            .collect::<Result<Vec<_>>>()?;
        let len = rows.iter().map(|(ids, _)| ids.len()).max().unwrap_or(0);
        let (mut ids, mut types, mut mask) = (Vec::new(), Vec::new(), Vec::new());
        for (row, segments) in &rows {
            let pad = len - row.len();
            ids.extend(row.iter().copied().chain(std::iter::repeat_n(pad_id, pad)));
            types.extend(segments.iter().copied().chain(std::iter::repeat_n(0, pad)));
            mask.extend((0..len).map(|i| i < row.len()));
        }
        Ok((TokenBatch::new(ids, Some(mask), rows.len(), len)?, types))
    }

    /// The tokens of an input of [`Tokenizer::encode_pairs`] before any cut: both texts'
    /// and the special tokens around them.
    pub fn pair_len(&self, a: &str, b: Option<&str>) -> Result<usize> {
        let err = |e| Error::Tokenizer(format!("{}: encoding {a:?}: {e}", self.path.display()));
        let count = |t: &str| self.inner.encode(t, false).map(|e| e.len()).map_err(err);
        let second = b.map(count).transpose()?;
        let added = self
            .inner
            .get_post_processor()
            .map_or(0, |p| p.added_tokens(second.is_some()));
        Ok(count(a)? + second.unwrap_or(0) + added)
    }

    /// One input of [`Tokenizer::encode_pairs`]: its ids and segment ids.
    fn encode_pair(
        &self,
        a: &str,
        b: Option<&str>,
        max_len: usize,
    ) -> Result<(Vec<usize>, Vec<usize>)> {
        use tokenizers::utils::truncation::{
            truncate_encodings, TruncationDirection, TruncationParams, TruncationStrategy,
        };
        let err = |e| Error::Tokenizer(format!("{}: encoding {a:?}: {e}", self.path.display()));
        let first = self.inner.encode(a, false).map_err(err)?;
        let second = b
            .map(|t| self.inner.encode(t, false))
            .transpose()
            .map_err(err)?;
        let added = self
            .inner
            .get_post_processor()
            .map_or(0, |p| p.added_tokens(second.is_some()));
        if max_len <= added {
            return Err(Error::invalid(
                "max_len",
                format!("{max_len} leaves no room for text beside the {added} special tokens"),
            ));
        }
        let params = TruncationParams {
            direction: TruncationDirection::Right,
            max_length: max_len - added,
            strategy: TruncationStrategy::LongestFirst,
            stride: 0,
        };
        let (first, second) = truncate_encodings(first, second, &params).map_err(err)?;
        let enc = self.inner.post_process(first, second, true).map_err(err)?;
        let to_usize = |v: &[u32]| v.iter().map(|&i| i as usize).collect();
        Ok((to_usize(enc.get_ids()), to_usize(enc.get_type_ids())))
    }

    /// Text of `ids`, without special tokens.
    pub fn decode(&self, ids: &[usize]) -> Result<String> {
        self.decode_keeping(ids, false)
    }

    /// Text of `ids`, with special tokens when `special` is true.
    fn decode_keeping(&self, ids: &[usize], special: bool) -> Result<String> {
        if let Some(m) = &self.marian {
            return Ok(m.decode(ids, special));
        }
        let ids: Vec<u32> = ids.iter().map(|&i| i as u32).collect();
        let text = self
            .inner
            .decode(&ids, !special)
            .map_err(|e| Error::Tokenizer(format!("{}: decoding: {e}", self.path.display())))?;
        Ok(match self.trim_decoded {
            true => text.trim().to_string(),
            false => text,
        })
    }

    /// Readable labels of `ids` (see [`labels`](super::labels)); ids in `also_special`
    /// (the model's BOS, EOS, padding) count as special besides the tokenizer's own.
    pub fn labels(&self, ids: &[usize], also_special: &[usize]) -> Result<Vec<TokenLabel>> {
        let special: HashSet<usize> = self
            .inner
            .get_added_tokens_decoder()
            .into_iter()
            .filter(|(_, t)| t.special)
            .map(|(id, _)| id as usize)
            .chain(also_special.iter().copied())
            .chain(
                ids.iter()
                    .copied()
                    .filter(|&id| self.marian.as_ref().is_some_and(|m| m.is_special(id))),
            )
            .collect();
        let decode = |ids: &[usize]| self.decode_keeping(ids, true);
        let piece = |id: usize| match &self.marian {
            Some(m) => m.piece(id).map_or_else(|| format!("#{id}"), str::to_string),
            None => self
                .inner
                .id_to_token(id as u32)
                .unwrap_or_else(|| format!("#{id}")),
        };
        label_tokens(ids, decode, piece, |id| special.contains(&id))
    }

    /// A decoder fed one token at a time, for printing tokens as they are generated: each
    /// step returns the text that token adds, and the pieces with
    /// [`TextStream::finish`]'s rest join into [`Tokenizer::decode`]'s text. Each step
    /// decodes every id so far, so that decoders which look at the whole text (a `Strip`
    /// of the text's first spaces) stream exactly, where the `tokenizers` crate's
    /// windowed `DecodeStream` does not. The cost grows with the length: about 66 ns an
    /// id for byte-level BPE here, 0.1 s over a whole 1,840-token stream.
    pub fn stream(&self) -> TextStream<'_> {
        TextStream {
            tokenizer: self,
            ids: Vec::new(),
            shown: String::new(),
            shown_ids: 0,
        }
    }

    /// This tokenizer, refused when it can produce an id at or past `vocab` (the rows of
    /// the model's token table): a tokenizer and weights that do not belong together,
    /// which would otherwise fail only when such a token comes up. The error names the
    /// file and the token.
    pub fn fitting(self, vocab: usize) -> Result<Self> {
        let (file, largest) = match &self.marian {
            Some(m) => (self.path.with_file_name("vocab.json"), m.largest()),
            None => {
                let all = self.inner.get_vocab(true);
                let top = all.into_iter().max_by_key(|&(_, id)| id);
                (self.path.clone(), top.map(|(t, id)| (id as usize, t)))
            }
        };
        match largest {
            Some((id, token)) if id >= vocab => Err(Error::Tokenizer(format!(
                "{}: token {token:?} has id {id}, outside the model's vocabulary of {vocab}: the tokenizer does not belong to these weights",
                file.display()
            ))),
            _ => Ok(self),
        }
    }

    /// The bytes each id below `vocab` stands for ([`token_bytes`](super::token_bytes)):
    /// a vocabulary piece spelled by the decoder's scheme, an added token as its text;
    /// an id the tokenizer does not have stands for none.
    pub fn token_bytes(&self, vocab: usize) -> Vec<Vec<u8>> {
        if let Some(m) = &self.marian {
            let spelling = Spelling {
                metaspace: true,
                ..Spelling::default()
            };
            return (0..vocab)
                .map(|id| m.piece(id).map_or_else(Vec::new, |p| spelling.bytes(p)))
                .collect();
        }
        let decoder = serde_json::to_value(self.inner.get_decoder()).ok();
        let spelling = Spelling::of_decoder(decoder.as_ref().filter(|d| !d.is_null()));
        let added = self.inner.get_added_tokens_decoder();
        (0..vocab)
            .map(|id| match added.get(&(id as u32)) {
                Some(t) => t.content.as_bytes().to_vec(),
                None => self
                    .inner
                    .id_to_token(id as u32)
                    .map_or_else(Vec::new, |p| spelling.bytes(&p)),
            })
            .collect()
    }

    /// The ids the tokenizer has: one past its largest (added tokens included).
    pub fn vocab_size(&self) -> usize {
        match &self.marian {
            Some(m) => m.largest().map_or(0, |(id, _)| id + 1),
            None => self.inner.get_vocab_size(true),
        }
    }

    /// The ids of the tokenizer's control tokens (added tokens marked special, Marian's
    /// `</s>` and `<pad>`): never text.
    pub fn special_ids(&self) -> HashSet<usize> {
        match &self.marian {
            Some(m) => (0..=m.largest().map_or(0, |(id, _)| id))
                .filter(|&id| m.is_special(id))
                .collect(),
            None => self
                .inner
                .get_added_tokens_decoder()
                .into_iter()
                .filter(|(_, t)| t.special)
                .map(|(id, _)| id as usize)
                .collect(),
        }
    }

    /// Id of a token string such as `[PAD]` or `</s>`.
    pub fn token_id(&self, token: &str) -> Option<usize> {
        match &self.marian {
            Some(m) => m.id(token),
            None => self.inner.token_to_id(token).map(|i| i as usize),
        }
    }
}

/// The post-processor that puts `</s>` (id `eos`) after every text, T5's.
fn eos_after(eos: usize) -> serde_json::Value {
    let eos_token = serde_json::json!({"SpecialToken": {"id": "</s>", "type_id": 0}});
    let seq = |id: &str| serde_json::json!({"Sequence": {"id": id, "type_id": 0}});
    serde_json::json!({
        "type": "TemplateProcessing",
        "single": [seq("A"), eos_token],
        "pair": [seq("A"), eos_token, seq("B"), eos_token],
        "special_tokens": {"</s>": {"id": "</s>", "ids": [eos], "tokens": ["</s>"]}},
    })
}
