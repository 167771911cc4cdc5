//! PNG figures: an SVG figure rasterised by resvg (pure Rust), at twice its size so text
//! stays sharp. Text is shaped with the fonts installed on the system, found at run
//! time; a character the chosen font lacks (Chinese, for most Latin fonts) is drawn
//! with any installed font that has it, so CJK tokens need a CJK font such as Debian's
//! `fonts-wqy-zenhei` or `fonts-noto-cjk`. `--font FILE` adds a font and makes it the
//! default.

use std::path::Path;
use std::sync::Arc;

use anyhow::{anyhow, Context, Result};
use resvg::tiny_skia::{Pixmap, Transform};
use resvg::usvg::{fontdb, Options, Tree};

/// Families preferred for figures' "sans-serif", the first installed one wins.
const SANS: &[&str] = &[
    "DejaVu Sans",
    "Noto Sans",
    "Liberation Sans",
    "WenQuanYi Zen Hei",
    "Noto Sans CJK SC",
];

/// What to install when the system has no font (the figure is then drawn without text).
pub const FONT_HINT: &str =
    "install fonts (Debian: apt-get install fonts-dejavu-core fonts-wqy-zenhei) or pass --font FILE.ttf";

/// Pixels per SVG unit.
const SCALE: f32 = 2.0;

fn fonts(font: Option<&Path>) -> Result<fontdb::Database> {
    let mut db = fontdb::Database::new();
    db.load_system_fonts();
    if let Some(path) = font {
        let before = db.len();
        db.load_font_file(path)
            .with_context(|| format!("--font {}", path.display()))?;
        let added = db
            .faces()
            .nth(before)
            .ok_or_else(|| anyhow!("--font {}: not a TrueType or OpenType font", path.display()))?;
        let family = added.families.first().map(|(name, _)| name.clone());
        if let Some(family) = family {
            db.set_sans_serif_family(family);
        }
    } else if db.is_empty() {
        eprintln!("warning: no fonts found, so the PNG has no text: {FONT_HINT}, or write .svg");
    } else if let Some(family) = SANS.iter().find(|f| {
        db.faces()
            .any(|face| face.families.iter().any(|(n, _)| n == *f))
    }) {
        db.set_sans_serif_family(*family);
    }
    Ok(db)
}

/// Fails unless `path` is a font file resvg can use, so that a bad `--font` is
/// reported before any work is done or any output written.
pub fn check_font(path: &Path) -> Result<()> {
    let mut db = fontdb::Database::new();
    db.load_font_file(path)
        .with_context(|| format!("--font {}", path.display()))?;
    match db.is_empty() {
        true => Err(anyhow!(
            "--font {}: not a TrueType or OpenType font",
            path.display()
        )),
        false => Ok(()),
    }
}

/// The PNG bytes of `svg`.
pub fn png(svg: &str, font: Option<&Path>) -> Result<Vec<u8>> {
    let options = Options {
        fontdb: Arc::new(fonts(font)?),
        ..Options::default()
    };
    let tree = Tree::from_str(svg, &options).context("reading the figure's SVG")?;
    let size = tree
        .size()
        .to_int_size()
        .scale_by(SCALE)
        .context("figure size")?;
    let mut pixmap = Pixmap::new(size.width(), size.height())
        .ok_or_else(|| anyhow!("a {}×{} image is too large", size.width(), size.height()))?;
    resvg::render(
        &tree,
        Transform::from_scale(SCALE, SCALE),
        &mut pixmap.as_mut(),
    );
    pixmap.encode_png().context("encoding the PNG")
}
