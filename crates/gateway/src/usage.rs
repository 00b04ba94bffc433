//! What a model call used, read from its reply as it streams through, in each dialect.
//!
//! Only the lines that carry usage are parsed: a streamed reply is scanned line by line (a line
//! longer than [`MAX_LINE`] is passed over, since usage lines are short), a whole reply is kept
//! up to [`MAX_WHOLE`] and parsed at its end. Memory stays bounded whatever the reply's size.

use serde_json::Value;

use crate::Dialect;

/// The longest SSE line kept for a look (usage events are a few hundred bytes).
const MAX_LINE: usize = 1024 * 1024;
/// The largest whole (non-streamed) reply kept for its usage.
const MAX_WHOLE: usize = 16 * 1024 * 1024;

/// The tokens of one model call.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct CallUsage {
    /// Input tokens, cached ones included.
    pub input: u64,
    /// Input tokens read from the provider's cache.
    pub cached_input: u64,
    /// Output tokens, reasoning included.
    pub output: u64,
}

impl CallUsage {
    /// Input plus output: what a token budget counts (cached input included).
    pub fn total(&self) -> u64 {
        self.input.saturating_add(self.output)
    }

    /// Adds `other` to this.
    pub fn add(&mut self, other: &CallUsage) {
        self.input = self.input.saturating_add(other.input);
        self.cached_input = self.cached_input.saturating_add(other.cached_input);
        self.output = self.output.saturating_add(other.output);
    }
}

/// Reads one reply's usage from its bytes as they pass.
#[derive(Debug)]
pub(crate) struct UsageScanner {
    dialect: Dialect,
    /// The partial line (SSE) or the whole body so far (JSON).
    buf: Vec<u8>,
    /// The current line is too long to be a usage line: skip to its end.
    skipping: bool,
    /// Whether the reply is an event stream (else one JSON body).
    streamed: bool,
    found: Option<CallUsage>,
}

fn num(v: &Value) -> u64 {
    v.as_u64().unwrap_or(0)
}

impl UsageScanner {
    pub(crate) fn new(dialect: Dialect, streamed: bool) -> Self {
        UsageScanner {
            dialect,
            buf: Vec::new(),
            skipping: false,
            streamed,
            found: None,
        }
    }

    /// Takes the next bytes of the reply.
    pub(crate) fn feed(&mut self, mut data: &[u8]) {
        if !self.streamed {
            let room = MAX_WHOLE.saturating_sub(self.buf.len());
            self.buf.extend_from_slice(&data[..data.len().min(room)]);
            return;
        }
        while !data.is_empty() {
            match memchr_newline(data) {
                Some(i) => {
                    if !self.skipping {
                        self.buf.extend_from_slice(&data[..i]);
                        let line = std::mem::take(&mut self.buf);
                        self.line(&line);
                    }
                    self.buf.clear();
                    self.skipping = false;
                    data = &data[i + 1..];
                }
                None => {
                    if !self.skipping {
                        if self.buf.len() + data.len() > MAX_LINE {
                            self.skipping = true;
                            self.buf.clear();
                        } else {
                            self.buf.extend_from_slice(data);
                        }
                    }
                    data = &[];
                }
            }
        }
    }

    /// The usage the reply reported, once it has ended.
    pub(crate) fn finish(mut self) -> Option<CallUsage> {
        if self.streamed {
            let rest = std::mem::take(&mut self.buf);
            if !self.skipping && !rest.is_empty() {
                self.line(&rest);
            }
        } else if let Ok(v) = serde_json::from_slice::<Value>(&self.buf) {
            self.event(&v);
        }
        self.found
    }

    fn line(&mut self, line: &[u8]) {
        let Some(data) = line.strip_prefix(b"data:") else {
            return;
        };
        // Cheap filter: only lines that mention usage are parsed.
        if memmem(data, b"sage").is_none() {
            return;
        }
        if let Ok(v) = serde_json::from_slice::<Value>(data) {
            self.event(&v);
        }
    }

    /// Reads usage from one event (streamed) or the whole reply; later events refine earlier.
    fn event(&mut self, v: &Value) {
        match self.dialect {
            Dialect::AnthropicMessages => {
                // `message_start` has the input (and a first output count); `message_delta`
                // the final output; a whole reply has both in `usage`.
                let usage = v
                    .get("message")
                    .and_then(|m| m.get("usage"))
                    .or_else(|| v.get("usage"));
                if let Some(u) = usage {
                    let mut found = self.found.unwrap_or_default();
                    let cache_read = num(&u["cache_read_input_tokens"]);
                    let input = num(&u["input_tokens"])
                        .saturating_add(cache_read)
                        .saturating_add(num(&u["cache_creation_input_tokens"]));
                    if input > 0 {
                        found.input = input;
                        found.cached_input = cache_read;
                    }
                    if let Some(out) = u.get("output_tokens").and_then(Value::as_u64) {
                        found.output = out;
                    }
                    self.found = Some(found);
                }
            }
            Dialect::OpenAiResponses => {
                let usage = v
                    .get("response")
                    .and_then(|r| r.get("usage"))
                    .or_else(|| v.get("usage"))
                    .filter(|u| u.is_object());
                if let Some(u) = usage {
                    self.found = Some(CallUsage {
                        input: num(&u["input_tokens"]),
                        cached_input: num(&u["input_tokens_details"]["cached_tokens"]),
                        output: num(&u["output_tokens"]),
                    });
                }
            }
            Dialect::Gemini => {
                if let Some(u) = v.get("usageMetadata").filter(|u| u.is_object()) {
                    self.found = Some(CallUsage {
                        input: num(&u["promptTokenCount"]),
                        cached_input: num(&u["cachedContentTokenCount"]),
                        output: num(&u["candidatesTokenCount"])
                            .saturating_add(num(&u["thoughtsTokenCount"])),
                    });
                }
            }
            Dialect::OpenAiChat => {
                if let Some(u) = v.get("usage").filter(|u| u.is_object()) {
                    self.found = Some(CallUsage {
                        input: num(&u["prompt_tokens"]),
                        cached_input: num(&u["prompt_tokens_details"]["cached_tokens"]),
                        output: num(&u["completion_tokens"]),
                    });
                }
            }
        }
    }
}

fn memchr_newline(data: &[u8]) -> Option<usize> {
    data.iter().position(|b| *b == b'\n')
}

fn memmem(hay: &[u8], needle: &[u8]) -> Option<usize> {
    hay.windows(needle.len()).position(|w| w == needle)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Feeds `reply` in chunks of `n` bytes.
    fn scan(dialect: Dialect, streamed: bool, reply: &str, n: usize) -> Option<CallUsage> {
        let mut s = UsageScanner::new(dialect, streamed);
        for chunk in reply.as_bytes().chunks(n) {
            s.feed(chunk);
        }
        s.finish()
    }

    fn both_ways(dialect: Dialect, streamed: bool, reply: &str) -> Option<CallUsage> {
        let whole = scan(dialect, streamed, reply, usize::MAX);
        for n in [1, 7, 64] {
            assert_eq!(
                scan(dialect, streamed, reply, n),
                whole,
                "{dialect} in chunks of {n}"
            );
        }
        whole
    }

    // Replies as the APIs document them (trimmed to the fields that matter).
    const ANTHROPIC_SSE: &str = "event: message_start\ndata: {\"type\":\"message_start\",\"message\":{\"id\":\"msg_1\",\"model\":\"claude-sonnet-4-5\",\"usage\":{\"input_tokens\":12,\"cache_creation_input_tokens\":100,\"cache_read_input_tokens\":2000,\"output_tokens\":1}}}\n\nevent: content_block_delta\ndata: {\"type\":\"content_block_delta\",\"index\":0,\"delta\":{\"type\":\"text_delta\",\"text\":\"usage is fine\"}}\n\nevent: message_delta\ndata: {\"type\":\"message_delta\",\"delta\":{\"stop_reason\":\"tool_use\"},\"usage\":{\"output_tokens\":87}}\n\nevent: message_stop\ndata: {\"type\":\"message_stop\"}\n\n";
    const ANTHROPIC_WHOLE: &str = r#"{"id":"msg_1","type":"message","content":[{"type":"text","text":"hi"}],"usage":{"input_tokens":30,"cache_read_input_tokens":0,"output_tokens":5}}"#;
    const RESPONSES_SSE: &str = "event: response.created\ndata: {\"type\":\"response.created\",\"response\":{\"id\":\"r\",\"usage\":null}}\n\nevent: response.output_text.delta\ndata: {\"type\":\"response.output_text.delta\",\"delta\":\"x\"}\n\nevent: response.completed\ndata: {\"type\":\"response.completed\",\"response\":{\"id\":\"r\",\"usage\":{\"input_tokens\":5000,\"input_tokens_details\":{\"cached_tokens\":4096},\"output_tokens\":300,\"output_tokens_details\":{\"reasoning_tokens\":200},\"total_tokens\":5300}}}\n\n";
    const RESPONSES_WHOLE: &str = r#"{"id":"r","object":"response","output":[],"usage":{"input_tokens":9,"input_tokens_details":{"cached_tokens":0},"output_tokens":3,"total_tokens":12}}"#;
    const GEMINI_SSE: &str = "data: {\"candidates\":[{\"content\":{\"parts\":[{\"text\":\"a\"}]}}],\"usageMetadata\":{\"promptTokenCount\":800,\"totalTokenCount\":800}}\r\n\r\ndata: {\"candidates\":[{\"content\":{\"parts\":[{\"text\":\"b\"}]},\"finishReason\":\"STOP\"}],\"usageMetadata\":{\"promptTokenCount\":800,\"candidatesTokenCount\":40,\"cachedContentTokenCount\":512,\"thoughtsTokenCount\":60,\"totalTokenCount\":900}}\r\n\r\n";
    const GEMINI_WHOLE: &str = r#"{"candidates":[],"usageMetadata":{"promptTokenCount":70,"candidatesTokenCount":7,"totalTokenCount":77}}"#;
    const CHAT_SSE: &str = "data: {\"choices\":[{\"delta\":{\"content\":\"hi\"}}]}\n\ndata: {\"choices\":[],\"usage\":{\"prompt_tokens\":150,\"completion_tokens\":25,\"prompt_tokens_details\":{\"cached_tokens\":64}}}\n\ndata: [DONE]\n\n";
    const CHAT_WHOLE: &str = r#"{"choices":[{"message":{"content":"hi"}}],"usage":{"prompt_tokens":15,"completion_tokens":2,"total_tokens":17}}"#;

    #[test]
    fn usage_is_read_in_every_dialect_streamed_and_whole_in_any_chunking() {
        let u = |input, cached_input, output| {
            Some(CallUsage {
                input,
                cached_input,
                output,
            })
        };
        assert_eq!(
            both_ways(Dialect::AnthropicMessages, true, ANTHROPIC_SSE),
            u(2112, 2000, 87)
        );
        assert_eq!(
            both_ways(Dialect::AnthropicMessages, false, ANTHROPIC_WHOLE),
            u(30, 0, 5)
        );
        assert_eq!(
            both_ways(Dialect::OpenAiResponses, true, RESPONSES_SSE),
            u(5000, 4096, 300)
        );
        assert_eq!(
            both_ways(Dialect::OpenAiResponses, false, RESPONSES_WHOLE),
            u(9, 0, 3)
        );
        assert_eq!(
            both_ways(Dialect::Gemini, true, GEMINI_SSE),
            u(800, 512, 100)
        );
        assert_eq!(both_ways(Dialect::Gemini, false, GEMINI_WHOLE), u(70, 0, 7));
        assert_eq!(
            both_ways(Dialect::OpenAiChat, true, CHAT_SSE),
            u(150, 64, 25)
        );
        assert_eq!(
            both_ways(Dialect::OpenAiChat, false, CHAT_WHOLE),
            u(15, 0, 2)
        );
        assert_eq!(u(2112, 2000, 87).map(|c| c.total()), Some(2199));
    }

    #[test]
    fn replies_without_usage_say_so_and_garbage_is_survived() {
        for d in Dialect::ALL {
            assert_eq!(
                scan(d, true, "data: {\"x\":1}\n\ndata: not json usage\n", 3),
                None
            );
            assert_eq!(scan(d, false, "{\"usage\": ", 3), None);
            assert_eq!(scan(d, false, "", 3), None);
        }
    }

    #[test]
    fn a_huge_line_is_passed_over_without_keeping_it() {
        let huge = format!("data: {{\"delta\":\"{}\"}}\n", "u".repeat(3 * MAX_LINE));
        let reply = format!("{huge}{CHAT_SSE}");
        let mut s = UsageScanner::new(Dialect::OpenAiChat, true);
        for chunk in reply.as_bytes().chunks(64 * 1024) {
            s.feed(chunk);
            assert!(s.buf.len() <= MAX_LINE + 64 * 1024);
        }
        assert_eq!(s.finish().map(|u| u.total()), Some(175));
    }
}
