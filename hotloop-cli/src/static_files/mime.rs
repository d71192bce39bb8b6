//! Content types by file extension: a small built-in table.

/// The type for a name's extension (case-insensitive);
/// `application/octet-stream` for anything else.
pub fn content_type(name: &str) -> &'static str {
    let Some((_, ext)) = name.rsplit_once('.') else { return DEFAULT };
    let ext = ext.to_ascii_lowercase();
    TYPES.iter().find(|(e, _)| *e == ext).map_or(DEFAULT, |(_, t)| t)
}

const DEFAULT: &str = "application/octet-stream";

const TYPES: &[(&str, &str)] = &[
    ("html", "text/html; charset=utf-8"),
    ("htm", "text/html; charset=utf-8"),
    ("css", "text/css; charset=utf-8"),
    ("js", "text/javascript; charset=utf-8"),
    ("mjs", "text/javascript; charset=utf-8"),
    ("json", "application/json"),
    ("map", "application/json"),
    ("txt", "text/plain; charset=utf-8"),
    ("md", "text/markdown; charset=utf-8"),
    ("csv", "text/csv; charset=utf-8"),
    ("xml", "application/xml"),
    ("svg", "image/svg+xml"),
    ("png", "image/png"),
    ("jpg", "image/jpeg"),
    ("jpeg", "image/jpeg"),
    ("gif", "image/gif"),
    ("webp", "image/webp"),
    ("avif", "image/avif"),
    ("ico", "image/x-icon"),
    ("wasm", "application/wasm"),
    ("pdf", "application/pdf"),
    ("zip", "application/zip"),
    ("gz", "application/gzip"),
    ("tar", "application/x-tar"),
    ("mp4", "video/mp4"),
    ("webm", "video/webm"),
    ("mp3", "audio/mpeg"),
    ("ogg", "audio/ogg"),
    ("woff", "font/woff"),
    ("woff2", "font/woff2"),
    ("ttf", "font/ttf"),
    ("otf", "font/otf"),
];

#[cfg(test)]
mod tests {
    use super::content_type;

    #[test]
    fn by_extension() {
        assert_eq!(content_type("index.html"), "text/html; charset=utf-8");
        assert_eq!(content_type("A.PNG"), "image/png");
        assert_eq!(content_type("archive.tar.gz"), "application/gzip");
        assert_eq!(content_type("README"), "application/octet-stream");
        assert_eq!(content_type("x.unknown"), "application/octet-stream");
    }
}
