//! One request schema for every interface: the fields a request may carry over JSON lines,
//! HTTP (OpenAI's image fields and the jobs API) and, by the same names, the CLI's flags and
//! the C ABI's `fd_request_config`. [`RequestFields::settings`] turns them into the engine's
//! [`RequestConfig`]; the range of every setting is checked once, by
//! [`crate::engine::check_request`], so a bad field gets the same error text whichever way
//! it came in.
//!
//! ```
//! use flashdiff_runtime::engine::RequestConfig;
//! use flashdiff_runtime::schema::RequestFields;
//! let f = RequestFields::from_json(br#"{"prompt": "a red circle", "steps": 20}"#).unwrap();
//! assert_eq!(f.settings(&RequestConfig::default()).unwrap().steps, 20);
//! let e = RequestFields::from_json(br#"{"steps": "many"}"#).unwrap_err();
//! assert!(e.to_string().starts_with("\"steps\""), "{e}");
//! ```

use std::time::Duration;

use serde::{Deserialize, Serialize};

use flashdiff_models::Denoiser;

use crate::engine::{fit_warmup, EngineError, LayoutKind, RequestConfig, Reuse};

/// A count given as a number or as a word (`"auto"`, `"workers"`, `"per-patch"`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(untagged)]
pub enum Count {
    /// A number.
    Number(u64),
    /// A word.
    Word(String),
}

/// The fields of a request. Every field is optional: what a request leaves out comes from
/// the interface's defaults (the server's flags, the model's warm-up).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RequestFields {
    /// The request's id (JSON lines; over HTTP the server numbers jobs itself).
    pub id: Option<u64>,
    /// The prompt.
    pub prompt: Option<String>,
    /// The model it is for (the server's own when left out).
    pub model: Option<String>,
    /// Noise seed.
    pub seed: Option<u64>,
    /// Total steps.
    pub steps: Option<u64>,
    /// Warm-up steps.
    pub warmup: Option<u64>,
    /// Patch count R, or `"auto"` for the adaptive controller.
    pub patches: Option<Count>,
    /// ε: the change budget (the patch gate's threshold in `patch-gate` mode).
    pub epsilon: Option<f64>,
    /// Whether ε follows the engine's load.
    pub adaptive_epsilon: Option<bool>,
    /// Longest run of skips per patch K.
    pub max_skip: Option<u64>,
    /// Work budget F in (0, 1]: the request's model work as a fraction of full computation's.
    pub budget: Option<f64>,
    /// Execution mode (`flashdiff`, `no-skip`, `full`, `naive-patch`, `teacache`, `ras`).
    pub mode: Option<String>,
    /// Patch layout: `saliency` or `uniform`.
    pub layout: Option<String>,
    /// Reused values: `extrapolate`, `extrapolate2`, `corrected`, `corrected2` or `stale`.
    pub reuse: Option<String>,
    /// Monotasks per step: a number, `"workers"` or `"per-patch"`.
    pub monotasks: Option<Count>,
    /// The threshold of whole-step caching (`teacache`) and of DBCache (`dbcache`).
    pub cache_threshold: Option<f64>,
    /// Scheduling priority.
    pub priority: Option<u64>,
    /// Milliseconds after submission by which the request should be done.
    pub deadline_ms: Option<u64>,
    /// OpenAI images: how many samples (seeds `seed`, `seed + 1`, ...).
    pub n: Option<u64>,
    /// OpenAI images: the image size, `WIDTHxHEIGHT`.
    pub size: Option<String>,
    /// OpenAI images: `b64_json`.
    pub response_format: Option<String>,
    /// OpenAI images: `png`.
    pub output_format: Option<String>,
    /// OpenAI images: the caller's name for itself (not used).
    pub user: Option<String>,
}

fn invalid(field: &'static str, reason: String) -> EngineError {
    EngineError::Invalid { field, reason }
}

/// A count field that does not fit the engine's settings is out of range: it keeps its value
/// (saturated) for [`crate::engine::check_request`] to report with the valid range.
fn saturate(v: u64) -> u32 {
    v.min(u32::MAX as u64) as u32
}

impl RequestFields {
    /// The fields of a JSON object; a field of the wrong type is named.
    pub fn from_json(bytes: &[u8]) -> Result<Self, EngineError> {
        let de = &mut serde_json::Deserializer::from_slice(bytes);
        serde_path_to_error::deserialize(de).map_err(|e| {
            let path = e.path().to_string();
            let inner = e.into_inner();
            let msg = strip_position(&inner.to_string()).to_string();
            if inner.is_syntax() || inner.is_eof() {
                invalid("request", format!("not JSON: {msg}"))
            } else if path.is_empty() || path == "." {
                invalid(
                    "request",
                    format!("is not a JSON object of request fields: {msg}"),
                )
            } else {
                let field = FIELDS
                    .iter()
                    .find(|f| **f == path)
                    .copied()
                    .unwrap_or("request");
                invalid(field, msg)
            }
        })
    }

    /// `base` with these fields applied. Words (mode, layout, reuse, counts) are checked
    /// here; ranges are left to [`crate::engine::check_request`].
    pub fn settings(&self, base: &RequestConfig) -> Result<RequestConfig, EngineError> {
        let mut c = base.clone();
        if let Some(s) = self.seed {
            c.seed = s;
        }
        if let Some(s) = self.steps {
            c.steps = saturate(s);
        }
        if let Some(w) = self.warmup {
            c.warmup = saturate(w);
        }
        if let Some(p) = &self.patches {
            c.patches = parse_patches(p)?;
        }
        if let Some(e) = self.epsilon {
            c.epsilon = e as f32;
        }
        if let Some(a) = self.adaptive_epsilon {
            c.adaptive_epsilon = a;
        }
        if let Some(k) = self.max_skip {
            c.max_skip = saturate(k);
        }
        if let Some(b) = self.budget {
            c.budget = Some(b as f32);
        }
        if let Some(m) = &self.mode {
            c.mode = m
                .parse()
                .map_err(|e| invalid("mode", format!("{m:?}: {e}")))?;
        }
        if let Some(l) = &self.layout {
            c.layout = parse_layout(l)?;
        }
        if let Some(r) = &self.reuse {
            c.reuse = parse_reuse(r)?;
        }
        if let Some(m) = &self.monotasks {
            c.monotasks = parse_monotasks(m)?;
        }
        if let Some(t) = self.cache_threshold {
            c.cache_threshold = t as f32;
        }
        if let Some(p) = self.priority {
            c.priority = p.min(u8::MAX as u64) as u8;
        }
        if let Some(d) = self.deadline_ms {
            if !(1..=86_400_000).contains(&d) {
                return Err(invalid(
                    "deadline_ms",
                    format!("{d}: must be in 1..=86400000 (a day)"),
                ));
            }
            c.deadline = Some(Duration::from_millis(d));
        }
        Ok(c)
    }

    /// The request as `front` takes it, decided in one place for every front end: the
    /// fields `front` refuses, the prompt (required), the model's name (the engine's own,
    /// when given; JSON lines route by it before they get here) and the defaults: `base`
    /// with these fields applied, and a warm-up left out taken from `warmup` (the
    /// operator's) or else fitted from the model's default to the steps.
    pub fn resolve(
        &self,
        front: Front,
        model: &dyn Denoiser,
        base: &RequestConfig,
        warmup: Option<u32>,
    ) -> Result<(String, RequestConfig), EngineError> {
        if let Some((field, why)) = self
            .given()
            .into_iter()
            .find_map(|f| front.refuses(f).map(|why| (f, why)))
        {
            return Err(EngineError::Refused {
                field,
                reason: why.to_string(),
            });
        }
        let prompt = match self.prompt.as_deref() {
            None => return Err(invalid("prompt", "is required (a string)".into())),
            Some(p) if p.contains('\0') => {
                return Err(invalid("prompt", "has a NUL character".into()))
            }
            Some(p) if front == Front::Http && p.trim().is_empty() => {
                return Err(invalid("prompt", "is empty".into()))
            }
            Some(p) => p.to_string(),
        };
        if front != Front::Lines {
            if let Some(m) = self.model.as_deref().filter(|m| *m != model.name()) {
                return Err(invalid(
                    "model",
                    format!("{m:?}: this engine runs {:?}", model.name()),
                ));
            }
        }
        let mut cfg = self.settings(base)?;
        if self.warmup.is_none() {
            cfg.warmup = match warmup {
                Some(w) if w >= cfg.steps => {
                    return Err(invalid(
                        "steps",
                        format!(
                            "{}: this server's --warmup {w} needs more; give a \"warmup\" \
                             below {}",
                            cfg.steps, cfg.steps
                        ),
                    ))
                }
                Some(w) => w,
                None => fit_warmup(model.default_warmup(), cfg.steps),
            };
        }
        Ok((prompt, cfg))
    }

    /// The names of the fields that are set, for an interface that takes only some of them.
    pub fn given(&self) -> Vec<&'static str> {
        let v = serde_json::to_value(self).unwrap_or_default();
        FIELDS
            .iter()
            .copied()
            .filter(|f| v.get(f).is_some_and(|x| !x.is_null()))
            .collect()
    }
}

/// Every field, by name.
pub const FIELDS: [&str; 23] = [
    "id",
    "prompt",
    "model",
    "seed",
    "steps",
    "warmup",
    "patches",
    "epsilon",
    "adaptive_epsilon",
    "max_skip",
    "budget",
    "mode",
    "layout",
    "reuse",
    "monotasks",
    "cache_threshold",
    "priority",
    "deadline_ms",
    "n",
    "size",
    "response_format",
    "output_format",
    "user",
];

/// The interface a request came through, which decides the fields it may carry.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Front {
    /// The HTTP server (OpenAI's image endpoint and the jobs API).
    Http,
    /// The JSON-lines server.
    Lines,
    /// The C ABI's `fd_engine_submit_json`.
    C,
    /// The Python package's `Engine`.
    Python,
}

impl Front {
    /// Why this front end refuses `field`, if it does.
    pub fn refuses(self, field: &str) -> Option<&'static str> {
        let image = IMAGE_FIELDS.contains(&field);
        match (self, field) {
            (Front::Http, "id") => Some("the server numbers its jobs itself"),
            (Front::Lines, _) if image => {
                Some("a field of the HTTP image endpoint, not of a JSON line")
            }
            (Front::C, _) if field == "id" || field == "model" || image => Some(
                "not taken here (the id is fd_engine_submit_json's argument, the model the \
                 engine's; image fields belong to HTTP)",
            ),
            (Front::Python, _) if field == "id" || image => Some(
                "not a setting of a request from Python (the engine numbers requests itself; n, \
                 size and the output format are the HTTP image API's)",
            ),
            _ => None,
        }
    }
}

/// A request to OpenAI's image endpoint, checked as `flashdiff serve --port` and the Ray
/// application check it: the prompt, the first image's settings, how many images (seeds
/// `seed`, `seed + 1`, ...) and the PNG scale over the model's image size.
#[derive(Debug, Clone)]
pub struct ImageRequest {
    /// The prompt.
    pub prompt: String,
    /// The first image's settings.
    pub cfg: RequestConfig,
    /// Images asked for, 1..=4.
    pub n: u32,
    /// The PNG's scale: `size` over the model's image size.
    pub scale: usize,
}

impl ImageRequest {
    /// Every field of `body` against `model`: the settings (as [`RequestFields::resolve`]
    /// takes them through [`Front::Http`]) and the image fields ("size" asks for a whole
    /// multiple of the model's image size). The settings' ranges are left to
    /// [`crate::engine::check_request`]; [`ImageRequest::check`] does both.
    pub fn parse(
        body: &[u8],
        base: &RequestConfig,
        warmup: Option<u32>,
        model: &dyn Denoiser,
    ) -> Result<Self, String> {
        let f = RequestFields::from_json(body).map_err(|e| e.to_string())?;
        let (prompt, cfg) = f
            .resolve(Front::Http, model, base, warmup)
            .map_err(|e| e.to_string())?;
        let side = model.image_size().unwrap_or((BUILTIN_IMAGE, BUILTIN_IMAGE));
        let n = match f.n {
            None => 1,
            Some(n @ 1..=4) => n as u32,
            Some(n) => return Err(format!("\"n\" {n}: must be in 1..=4")),
        };
        let (sw, sh) = (side.0.max(1) as u64, side.1.max(1) as u64);
        // The built-in 32-pixel images may be enlarged up to 32x (8x by default); larger
        // images up to 1024 pixels a side.
        let most = (1024 / sw.max(sh)).clamp(1, 32);
        let scale = match f.size.as_deref() {
            None => (256 / sw).clamp(1, 8) as usize,
            Some(s) => {
                let parsed = s
                    .split_once('x')
                    .and_then(|(w, h)| Some((w.parse::<u64>().ok()?, h.parse::<u64>().ok()?)));
                match parsed {
                    Some((w, h))
                        if w % sw == 0 && (1..=most).contains(&(w / sw)) && h * sw == w * sh =>
                    {
                        (w / sw) as usize
                    }
                    _ => {
                        return Err(format!(
                            "\"size\" {s:?}: must be {sw}x{sh} times a whole number up to {most} \
                             (the model makes {sw}x{sh} images, scaled up)"
                        ))
                    }
                }
            }
        };
        if let Some(f) = f.response_format.as_deref().filter(|f| *f != "b64_json") {
            return Err(format!(
                "\"response_format\" {f:?}: only \"b64_json\" is supported (no image hosting)"
            ));
        }
        if let Some(f) = f.output_format.as_deref().filter(|f| *f != "png") {
            return Err(format!(
                "\"output_format\" {f:?}: only \"png\" is supported"
            ));
        }
        Ok(Self {
            prompt,
            cfg,
            n,
            scale,
        })
    }

    /// [`ImageRequest::parse`], then the settings together and the prompt against the
    /// model's vocabulary, so that what passes can run; returns the prompt conditioned.
    pub fn check(
        body: &[u8],
        base: &RequestConfig,
        warmup: Option<u32>,
        model: &dyn Denoiser,
    ) -> Result<(Self, flashdiff_models::Conditioning), String> {
        let g = Self::parse(body, base, warmup, model)?;
        crate::engine::check_request(model, &g.cfg).map_err(|e| e.to_string())?;
        let cond = model
            .condition(&g.prompt)
            .map_err(|e| format!("\"prompt\": {e}"))?;
        Ok((g, cond))
    }

    /// Image `i`'s settings: the first image's with seed `seed + i`.
    pub fn image(&self, i: u32) -> RequestConfig {
        RequestConfig {
            seed: self.cfg.seed.wrapping_add(u64::from(i)),
            ..self.cfg.clone()
        }
    }
}

/// The side of the built-in models' images, for a model that does not say.
const BUILTIN_IMAGE: usize = flashdiff_models::families::tinydit::scene::IMAGE;

/// The fields only OpenAI's image endpoint takes.
pub const IMAGE_FIELDS: [&str; 5] = ["n", "size", "response_format", "output_format", "user"];

/// serde_json's messages end with "at line L column C", which says nothing to a caller of
/// the CLI or the C ABI.
fn strip_position(msg: &str) -> &str {
    msg.find(" at line ").map_or(msg, |i| &msg[..i])
}

/// `patches`: a count, or `auto` (`None`: the adaptive controller).
pub fn parse_patches(v: &Count) -> Result<Option<u32>, EngineError> {
    match v {
        Count::Number(n) => Ok(Some(saturate(*n))),
        Count::Word(w) if w == "auto" => Ok(None),
        Count::Word(w) => w
            .parse::<u64>()
            .map(|n| Some(saturate(n)))
            .map_err(|_| invalid("patches", format!("{w:?}: expected auto or a patch count"))),
    }
}

/// `monotasks`: a count, `workers` (`None`: one per worker) or `per-patch`.
pub fn parse_monotasks(v: &Count) -> Result<Option<u32>, EngineError> {
    match v {
        Count::Number(n) => Ok(Some(saturate(*n))),
        Count::Word(w) if w == "workers" => Ok(None),
        Count::Word(w) if w == "per-patch" => Ok(Some(u32::MAX)),
        Count::Word(w) => w.parse::<u64>().map(|n| Some(saturate(n))).map_err(|_| {
            invalid(
                "monotasks",
                format!("{w:?}: expected workers, per-patch or a count"),
            )
        }),
    }
}

/// `reuse`: `extrapolate`, `extrapolate2`, `corrected`, `corrected2` or `stale`.
pub fn parse_reuse(v: &str) -> Result<Reuse, EngineError> {
    v.parse()
        .map_err(|e| invalid("reuse", format!("{v:?}: {e}")))
}

/// `layout`: `saliency` or `uniform`.
pub fn parse_layout(v: &str) -> Result<LayoutKind, EngineError> {
    match v {
        "saliency" => Ok(LayoutKind::Saliency),
        "uniform" => Ok(LayoutKind::Uniform),
        _ => Err(invalid(
            "layout",
            format!("{v:?}: expected saliency or uniform"),
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn model() -> std::sync::Arc<dyn Denoiser> {
        flashdiff_models::pipelines::registry::ModelSpec::builtin("tinydit")
            .expect("the built-in model")
            .load(&flashdiff_models::Device::Cpu)
            .expect("its weights")
            .into()
    }

    fn resolve(front: Front, json: &str, warmup: Option<u32>) -> Result<RequestConfig, String> {
        let m = model();
        RequestFields::from_json(json.as_bytes())
            .and_then(|f| f.resolve(front, &*m, &RequestConfig::default(), warmup))
            .map(|(_, c)| c)
            .map_err(|e| e.to_string())
    }

    #[test]
    fn every_front_fits_a_left_out_warmup_to_the_model_and_the_steps() {
        let fronts = [Front::Http, Front::Lines, Front::C, Front::Python];
        for front in fronts {
            let c = resolve(front, r#"{"prompt": "a red circle", "steps": 4}"#, None).unwrap();
            assert_eq!(c.warmup, 3, "{front:?}");
            let c = resolve(front, r#"{"prompt": "a red circle", "steps": 40}"#, None).unwrap();
            assert_eq!(c.warmup, model().default_warmup(), "{front:?}");
            let c = resolve(front, r#"{"prompt": "a red circle", "warmup": 2}"#, Some(7));
            assert_eq!(c.unwrap().warmup, 2, "{front:?}: the request's own");
            let c = resolve(front, r#"{"prompt": "a red circle", "steps": 40}"#, Some(7));
            assert_eq!(c.unwrap().warmup, 7, "{front:?}: the operator's");
            let e = resolve(front, r#"{"prompt": "a red circle", "steps": 6}"#, Some(7));
            assert!(e.unwrap_err().starts_with("\"steps\""), "{front:?}");
        }
    }

    #[test]
    fn each_front_refuses_its_own_fields_and_names_them() {
        let cases = [
            (
                Front::Http,
                r#"{"prompt": "a red circle", "id": 3}"#,
                Some("id"),
            ),
            (Front::Http, r#"{"prompt": "a red circle", "n": 2}"#, None),
            (Front::Http, r#"{"prompt": " "}"#, Some("prompt")),
            (Front::Lines, r#"{"prompt": "a red circle", "id": 3}"#, None),
            (
                Front::Lines,
                r#"{"prompt": "a red circle", "size": "64x64"}"#,
                Some("size"),
            ),
            (
                Front::Lines,
                r#"{"prompt": "a red circle", "model": "tinyvideo"}"#,
                None,
            ),
            (
                Front::C,
                r#"{"prompt": "a red circle", "id": 3}"#,
                Some("id"),
            ),
            (
                Front::C,
                r#"{"prompt": "a red circle", "model": "tinydit"}"#,
                Some("model"),
            ),
            (
                Front::C,
                r#"{"prompt": "a red circle", "user": "me"}"#,
                Some("user"),
            ),
            (
                Front::Python,
                r#"{"prompt": "a red circle", "id": 3}"#,
                Some("id"),
            ),
            (
                Front::Python,
                r#"{"prompt": "a red circle", "model": "tinydit"}"#,
                None,
            ),
            (
                Front::Python,
                r#"{"prompt": "a red circle", "model": "tinyvideo"}"#,
                Some("model"),
            ),
            (Front::Python, r#"{"steps": 3}"#, Some("prompt")),
            (
                Front::Python,
                "{\"prompt\": \"a red\\u0000circle\"}",
                Some("prompt"),
            ),
        ];
        for (front, json, refused) in cases {
            let r = resolve(front, json, None);
            match refused {
                None => assert!(r.is_ok(), "{front:?} {json}: {r:?}"),
                Some(f) => {
                    let e = r.expect_err(json);
                    assert!(e.starts_with(&format!("\"{f}\"")), "{front:?} {json}: {e}");
                }
            }
        }
    }

    #[test]
    fn fields_apply_and_bad_ones_are_named() {
        let f = RequestFields::from_json(
            br#"{"steps": 30, "patches": "auto", "monotasks": "per-patch", "reuse": "stale",
                "mode": "ras", "deadline_ms": 5, "layout": "uniform"}"#,
        )
        .unwrap();
        let c = f.settings(&RequestConfig::default()).unwrap();
        assert_eq!(c.steps, 30);
        assert_eq!(c.patches, None);
        assert_eq!(c.monotasks, Some(u32::MAX));
        assert_eq!(c.reuse, Reuse::Stale);
        assert_eq!(c.layout, LayoutKind::Uniform);
        assert_eq!(c.deadline, Some(Duration::from_millis(5)));
        assert_eq!(
            f.given(),
            [
                "steps",
                "patches",
                "mode",
                "layout",
                "reuse",
                "monotasks",
                "deadline_ms"
            ]
        );
        let named = |json: &str, field: &str| {
            let e = RequestFields::from_json(json.as_bytes())
                .and_then(|f| f.settings(&RequestConfig::default()))
                .unwrap_err();
            assert!(
                matches!(e, EngineError::Invalid { field: f, .. } if f == field),
                "{json}: {e}"
            );
            assert!(e.to_string().starts_with(&format!("\"{field}\"")), "{e}");
        };
        named(r#"{"steps": -1}"#, "steps");
        named(r#"{"epsilon": "high"}"#, "epsilon");
        named(r#"{"mode": "fast"}"#, "mode");
        named(r#"{"patches": "many"}"#, "patches");
        named(r#"{"deadline_ms": 0}"#, "deadline_ms");
        named(r#"{"reuse": "fresh"}"#, "reuse");
        named(r#"{"colour": 1}"#, "request");
        named(r#"[1, 2]"#, "request");
    }

    #[test]
    fn counts_too_large_for_the_engine_keep_their_size() {
        let f = RequestFields::from_json(br#"{"steps": 99999999999, "max_skip": 5000}"#).unwrap();
        let c = f.settings(&RequestConfig::default()).unwrap();
        assert_eq!((c.steps, c.max_skip), (u32::MAX, 5000));
    }
}
