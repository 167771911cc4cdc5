//! Which endpoint a generation answers, and the names its answers carry.

/// Which endpoint a generation answers.
#[derive(Clone, Copy, PartialEq)]
pub enum Kind {
    Completion,
    Chat,
}

impl Kind {
    pub fn id_prefix(self) -> &'static str {
        match self {
            Kind::Completion => "cmpl",
            Kind::Chat => "chatcmpl",
        }
    }

    /// The `object` of a whole answer, or of a streamed chunk.
    pub fn object(self, chunk: bool) -> &'static str {
        match (self, chunk) {
            (Kind::Completion, _) => "text_completion",
            (Kind::Chat, false) => "chat.completion",
            (Kind::Chat, true) => "chat.completion.chunk",
        }
    }
}
