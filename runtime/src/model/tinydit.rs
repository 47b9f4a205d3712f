use std::path::Path;

use flashdiff_kernels::{
    gelu_tanh_f32, layer_norm_f32, modulate_f32, silu_f32, AttnStats, Backend, Cpu, GroupMass,
};

use super::weights::{Weights, WeightsError};

const EPS: f32 = 1e-6;

/// Model hyper-parameters (from the weights file's metadata).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Config {
    /// Image side in pixels.
    pub image: usize,
    /// Patch side in pixels (one latent token per patch).
    pub patch: usize,
    /// Colour channels.
    pub channels: usize,
    /// Width.
    pub d: usize,
    /// Transformer blocks.
    pub depth: usize,
    /// Attention heads.
    pub heads: usize,
    /// Text encoder layers.
    pub text_layers: usize,
    /// Vocabulary size.
    pub vocab: usize,
    /// Prompt length in tokens (padded).
    pub max_tokens: usize,
    /// MLP hidden = d * mlp_ratio.
    pub mlp_ratio: usize,
}

impl Config {
    /// Latent grid side (tokens per row).
    pub fn grid(&self) -> usize {
        self.image / self.patch
    }
    /// Latent tokens.
    pub fn tokens(&self) -> usize {
        self.grid() * self.grid()
    }
    /// Values per latent token.
    pub fn patch_dim(&self) -> usize {
        self.patch * self.patch * self.channels
    }
}

#[derive(Debug, Clone, Copy)]
struct Lin {
    w: usize,
    b: usize,
    out: usize,
    inp: usize,
}

#[derive(Debug)]
struct TextLayer {
    ln1: (usize, usize),
    ln2: (usize, usize),
    qkv: Lin,
    proj: Lin,
    fc1: Lin,
    fc2: Lin,
}

#[derive(Debug)]
struct Block {
    ada: Lin,
    qkv: Lin,
    proj: Lin,
    cq: Lin,
    ckv: Lin,
    cproj: Lin,
    fc1: Lin,
    fc2: Lin,
}

/// The model: weights (mapped) and the layer table.
pub struct TinyDit {
    cfg: Config,
    w: Weights,
    slices: Vec<(String, Vec<usize>)>,
    tok_emb: usize,
    txt_pos: usize,
    text: Vec<TextLayer>,
    txt_ln: (usize, usize),
    t1: Lin,
    t2: Lin,
    pool: Lin,
    x_embed: Lin,
    pos: usize,
    blocks: Vec<Block>,
    final_ada: Lin,
    final_: Lin,
    vocab: Vec<String>,
    saliency_layers: Vec<usize>,
    backend: Box<dyn Backend>,
}

impl std::fmt::Debug for TinyDit {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TinyDit")
            .field("cfg", &self.cfg)
            .field("weights", &self.w.path())
            .finish()
    }
}

/// Per-request prompt state, computed once: encoded text, its pooled conditioning, and every
/// block's cross-attention keys and values.
#[derive(Debug, Clone)]
pub struct TextContext {
    pooled: Vec<f32>,
    /// Per block `max_tokens x d`, blocks concatenated.
    cross_k: Vec<f32>,
    cross_v: Vec<f32>,
}

impl TextContext {
    /// Rebuilds a context from its parts (as stored in a request's shared state).
    pub fn from_parts(pooled: &[f32], cross_k: &[f32], cross_v: &[f32]) -> Self {
        Self {
            pooled: pooled.to_vec(),
            cross_k: cross_k.to_vec(),
            cross_v: cross_v.to_vec(),
        }
    }

    /// (pooled, cross K, cross V), for storing.
    pub fn parts(&self) -> (&[f32], &[f32], &[f32]) {
        (&self.pooled, &self.cross_k, &self.cross_v)
    }
}

/// Per-(request, step) conditioning shared by all patches: each block's adaLN vectors.
#[derive(Debug, Clone)]
pub struct StepCond {
    /// Per block `6 d`, then the final `2 d`.
    all: Vec<f32>,
}

impl StepCond {
    /// Rebuilds conditioning from its stored form.
    pub fn from_slice(v: &[f32]) -> Self {
        Self { all: v.to_vec() }
    }

    /// The stored form.
    pub fn as_slice(&self) -> &[f32] {
        &self.all
    }
}

/// Self-attention keys and values of every latent token at every block, as last computed,
/// `depth x tokens x d` each.
#[derive(Debug, Clone, PartialEq)]
pub struct KvCache {
    d: usize,
    tokens: usize,
    /// Keys.
    pub k: Vec<f32>,
    /// Values.
    pub v: Vec<f32>,
}

/// A borrowed K/V cache (e.g. inside a shared request state), same layout as [`KvCache`].
#[derive(Debug, Clone, Copy)]
pub struct CacheView<'a> {
    /// Keys, `depth x tokens x d`.
    pub k: &'a [f32],
    /// Values.
    pub v: &'a [f32],
}

impl KvCache {
    /// A zeroed cache for `blocks` blocks of `tokens x d`.
    pub fn new(blocks: usize, tokens: usize, d: usize) -> Self {
        Self {
            d,
            tokens,
            k: vec![0.0; blocks * tokens * d],
            v: vec![0.0; blocks * tokens * d],
        }
    }

    /// Borrowed view.
    pub fn view(&self) -> CacheView<'_> {
        CacheView {
            k: &self.k,
            v: &self.v,
        }
    }

    /// Keys of block `l`.
    pub fn layer_k(&self, l: usize) -> &[f32] {
        &self.k[l * self.tokens * self.d..(l + 1) * self.tokens * self.d]
    }

    /// Values of block `l`.
    pub fn layer_v(&self, l: usize) -> &[f32] {
        &self.v[l * self.tokens * self.d..(l + 1) * self.tokens * self.d]
    }

    /// Writes the fresh rows of a [`ForwardOut`] for tokens `active`.
    pub fn update(&mut self, active: &[u32], fresh: &ForwardOut) {
        write_rows(&mut self.k, &mut self.v, self.tokens, self.d, active, fresh);
    }
}

/// Scatters a forward's fresh K/V rows (tokens `active`) into `depth x tokens x d` buffers.
pub fn write_rows(
    k: &mut [f32],
    v: &mut [f32],
    tokens: usize,
    d: usize,
    active: &[u32],
    fresh: &ForwardOut,
) {
    for l in 0..fresh.k.len() {
        let (k_l, v_l) = (
            &mut k[l * tokens * d..(l + 1) * tokens * d],
            &mut v[l * tokens * d..(l + 1) * tokens * d],
        );
        flashdiff_kernels::scatter_rows_f32(&fresh.k[l], d, active, k_l);
        flashdiff_kernels::scatter_rows_f32(&fresh.v[l], d, active, v_l);
    }
}

/// Result of a (subset) forward.
#[derive(Debug, Clone, PartialEq)]
pub struct ForwardOut {
    /// Velocity of the active tokens, `n x patch_dim`.
    pub velocity: Vec<f32>,
    /// Fresh keys of the active tokens, per block `n x d`.
    pub k: Vec<Vec<f32>>,
    /// Fresh values, per block `n x d`.
    pub v: Vec<Vec<f32>>,
}

/// Statistics to accumulate during a forward (see [`TinyDit::forward`]).
#[derive(Debug, Default)]
pub struct StepStats<'a> {
    /// `n x max_tokens`: cross-attention of the active tokens, averaged over heads and the
    /// saliency layers (added, weight 1).
    pub cross: Option<&'a mut [f32]>,
    /// Patch of every latent token and the patch count; `mass` gets `n x patches`: each active
    /// token's self-attention mass into each patch, averaged over heads and blocks.
    pub patch_mass: Option<(&'a [u32], usize, &'a mut [f32])>,
}

fn parse_config(w: &Weights) -> Result<Config, WeightsError> {
    let bad = |m: String| WeightsError::Metadata(m);
    let v: serde_json::Value = serde_json::from_str(w.meta("config")?)
        .map_err(|e| bad(format!("config is not JSON: {e}")))?;
    let get = |k: &str| -> Result<usize, WeightsError> {
        v.get(k)
            .and_then(|x| x.as_u64())
            .map(|x| x as usize)
            .ok_or_else(|| bad(format!("config has no integer {k:?}")))
    };
    let cfg = Config {
        image: get("image")?,
        patch: get("patch")?,
        channels: get("channels")?,
        d: get("d")?,
        depth: get("depth")?,
        heads: get("heads")?,
        text_layers: get("text_layers")?,
        vocab: get("vocab")?,
        max_tokens: get("max_tokens")?,
        mlp_ratio: get("mlp_ratio")?,
    };
    if cfg.patch == 0
        || cfg.image % cfg.patch != 0
        || cfg.heads == 0
        || cfg.d % cfg.heads != 0
        || cfg.d % 4 != 0
        || cfg.depth == 0
    {
        return Err(bad(format!("inconsistent config {cfg:?}")));
    }
    Ok(cfg)
}

impl TinyDit {
    /// Loads a model from a safetensors file written by `models/tinydit/export.py`.
    pub fn load(path: &Path) -> Result<Self, WeightsError> {
        let w = Weights::open(path)?;
        let format = w.meta("format")?;
        if format != "flashdiff-tinydit" {
            return Err(WeightsError::Metadata(format!(
                "format {format:?}, expected \"flashdiff-tinydit\""
            )));
        }
        let cfg = parse_config(&w)?;
        let vocab: Vec<String> = serde_json::from_str(w.meta("vocab")?)
            .map_err(|e| WeightsError::Metadata(format!("vocab: {e}")))?;
        if vocab.len() != cfg.vocab {
            return Err(WeightsError::Metadata(format!(
                "vocab has {} words, config says {}",
                vocab.len(),
                cfg.vocab
            )));
        }
        let saliency_layers: Vec<usize> = serde_json::from_str(w.meta("saliency_layers")?)
            .map_err(|e| WeightsError::Metadata(format!("saliency_layers: {e}")))?;
        if saliency_layers.is_empty() || saliency_layers.iter().any(|&l| l >= cfg.depth) {
            return Err(WeightsError::Metadata(format!(
                "saliency_layers {saliency_layers:?} must name blocks below {}",
                cfg.depth
            )));
        }
        let mut m = Self {
            cfg: cfg.clone(),
            w,
            slices: Vec::new(),
            tok_emb: 0,
            txt_pos: 0,
            text: Vec::new(),
            txt_ln: (0, 0),
            t1: Lin {
                w: 0,
                b: 0,
                out: 0,
                inp: 0,
            },
            t2: Lin {
                w: 0,
                b: 0,
                out: 0,
                inp: 0,
            },
            pool: Lin {
                w: 0,
                b: 0,
                out: 0,
                inp: 0,
            },
            x_embed: Lin {
                w: 0,
                b: 0,
                out: 0,
                inp: 0,
            },
            pos: 0,
            blocks: Vec::new(),
            final_ada: Lin {
                w: 0,
                b: 0,
                out: 0,
                inp: 0,
            },
            final_: Lin {
                w: 0,
                b: 0,
                out: 0,
                inp: 0,
            },
            vocab,
            saliency_layers,
            backend: Box::new(Cpu),
        };
        let d = cfg.d;
        let h = d * cfg.mlp_ratio;
        m.tok_emb = m.tensor("tok_emb.weight", &[cfg.vocab, d])?;
        m.txt_pos = m.tensor("txt_pos", &[cfg.max_tokens, d])?;
        for i in 0..cfg.text_layers {
            let p = format!("text.{i}");
            let layer = TextLayer {
                ln1: (
                    m.tensor(&format!("{p}.ln1.weight"), &[d])?,
                    m.tensor(&format!("{p}.ln1.bias"), &[d])?,
                ),
                ln2: (
                    m.tensor(&format!("{p}.ln2.weight"), &[d])?,
                    m.tensor(&format!("{p}.ln2.bias"), &[d])?,
                ),
                qkv: m.lin(&format!("{p}.attn.qkv"), 3 * d, d)?,
                proj: m.lin(&format!("{p}.attn.proj"), d, d)?,
                fc1: m.lin(&format!("{p}.mlp.fc1"), h, d)?,
                fc2: m.lin(&format!("{p}.mlp.fc2"), d, h)?,
            };
            m.text.push(layer);
        }
        m.txt_ln = (
            m.tensor("txt_ln.weight", &[d])?,
            m.tensor("txt_ln.bias", &[d])?,
        );
        m.t1 = m.lin("t_mlp1", d, 256)?;
        m.t2 = m.lin("t_mlp2", d, d)?;
        m.pool = m.lin("pool", d, d)?;
        m.x_embed = m.lin("x_embed", d, cfg.patch_dim())?;
        m.pos = m.tensor("pos_embed", &[cfg.tokens(), d])?;
        for i in 0..cfg.depth {
            let p = format!("blocks.{i}");
            let b = Block {
                ada: m.lin(&format!("{p}.ada"), 6 * d, d)?,
                qkv: m.lin(&format!("{p}.attn.qkv"), 3 * d, d)?,
                proj: m.lin(&format!("{p}.attn.proj"), d, d)?,
                cq: m.lin(&format!("{p}.cross.q"), d, d)?,
                ckv: m.lin(&format!("{p}.cross.kv"), 2 * d, d)?,
                cproj: m.lin(&format!("{p}.cross.proj"), d, d)?,
                fc1: m.lin(&format!("{p}.mlp.fc1"), h, d)?,
                fc2: m.lin(&format!("{p}.mlp.fc2"), d, h)?,
            };
            m.blocks.push(b);
        }
        m.final_ada = m.lin("final_ada", 2 * d, d)?;
        m.final_ = m.lin("final", cfg.patch_dim(), d)?;
        Ok(m)
    }

    fn tensor(&mut self, name: &str, shape: &[usize]) -> Result<usize, WeightsError> {
        self.w.get(name, shape)?;
        self.slices.push((name.to_string(), shape.to_vec()));
        Ok(self.slices.len() - 1)
    }

    fn lin(&mut self, name: &str, out: usize, inp: usize) -> Result<Lin, WeightsError> {
        Ok(Lin {
            w: self.tensor(&format!("{name}.weight"), &[out, inp])?,
            b: self.tensor(&format!("{name}.bias"), &[out])?,
            out,
            inp,
        })
    }

    fn t(&self, id: usize) -> &[f32] {
        let (name, shape) = &self.slices[id];
        self.w.get(name, shape).expect("checked at load")
    }

    fn apply(&self, l: Lin, x: &[f32], rows: usize) -> Vec<f32> {
        let mut y = vec![0.0; rows * l.out];
        self.backend.linear(
            x,
            rows,
            l.inp,
            self.t(l.w),
            Some(self.t(l.b)),
            l.out,
            &mut y,
        );
        y
    }

    /// Hyper-parameters.
    pub fn config(&self) -> &Config {
        &self.cfg
    }

    /// The vocabulary (index 0 is the padding token).
    pub fn vocab(&self) -> &[String] {
        &self.vocab
    }

    /// Blocks whose cross-attention makes the saliency map.
    pub fn saliency_layers(&self) -> &[usize] {
        &self.saliency_layers
    }

    /// A zeroed K/V cache for this model.
    pub fn new_cache(&self) -> KvCache {
        KvCache::new(self.cfg.depth, self.cfg.tokens(), self.cfg.d)
    }

    /// Encodes a prompt (token ids, padded to `max_tokens`) once per request.
    pub fn encode_text(&self, ids: &[u32]) -> TextContext {
        let (d, n) = (self.cfg.d, self.cfg.max_tokens);
        assert_eq!(
            ids.len(),
            n,
            "encode_text: ids must be padded to max_tokens"
        );
        let emb = self.t(self.tok_emb);
        let pos = self.t(self.txt_pos);
        let mut x = vec![0.0f32; n * d];
        for (i, &id) in ids.iter().enumerate() {
            let id = (id as usize).min(self.cfg.vocab - 1);
            for c in 0..d {
                x[i * d + c] = emb[id * d + c] + pos[i * d + c];
            }
        }
        for l in &self.text {
            let mut a = x.clone();
            layer_norm_f32(&mut a, d, EPS, Some(self.t(l.ln1.0)), Some(self.t(l.ln1.1)));
            let qkv = self.apply(l.qkv, &a, n);
            let (q, k, v) = split3(&qkv, n, d);
            let mut o = vec![0.0; n * d];
            self.backend.attention(
                &q,
                n,
                &k,
                &v,
                n,
                d,
                self.cfg.heads,
                &mut o,
                &mut AttnStats::default(),
            );
            add(&mut x, &self.apply(l.proj, &o, n));
            let mut a = x.clone();
            layer_norm_f32(&mut a, d, EPS, Some(self.t(l.ln2.0)), Some(self.t(l.ln2.1)));
            let mut hdn = self.apply(l.fc1, &a, n);
            gelu_tanh_f32(&mut hdn);
            add(&mut x, &self.apply(l.fc2, &hdn, n));
        }
        layer_norm_f32(
            &mut x,
            d,
            EPS,
            Some(self.t(self.txt_ln.0)),
            Some(self.t(self.txt_ln.1)),
        );
        let mut mean = vec![0.0f32; d];
        for row in x.chunks_exact(d) {
            add(&mut mean, row);
        }
        mean.iter_mut().for_each(|m| *m /= n as f32);
        let pooled = self.apply(self.pool, &mean, 1);
        let (mut cross_k, mut cross_v) = (Vec::new(), Vec::new());
        for b in &self.blocks {
            let kv = self.apply(b.ckv, &x, n);
            let (k, v) = split2(&kv, n, d);
            cross_k.extend_from_slice(&k);
            cross_v.extend_from_slice(&v);
        }
        TextContext {
            pooled,
            cross_k,
            cross_v,
        }
    }

    /// Conditioning for time `t` (1 = noise, 0 = data), shared by every patch of a step.
    pub fn step_cond(&self, text: &TextContext, t: f32) -> StepCond {
        let half = 128;
        let mut emb = vec![0.0f32; 2 * half];
        for i in 0..half {
            let f = (-(10000f32).ln() * i as f32 / half as f32).exp();
            let a = 1000.0 * t * f;
            emb[i] = a.cos();
            emb[half + i] = a.sin();
        }
        let mut c = self.apply(self.t1, &emb, 1);
        silu_f32(&mut c);
        let mut c = self.apply(self.t2, &c, 1);
        add(&mut c, &text.pooled);
        silu_f32(&mut c);
        let mut all = Vec::with_capacity(self.blocks.len() * 6 * self.cfg.d + 2 * self.cfg.d);
        for b in &self.blocks {
            all.extend_from_slice(&self.apply(b.ada, &c, 1));
        }
        all.extend_from_slice(&self.apply(self.final_ada, &c, 1));
        StepCond { all }
    }

    /// Forward of the tokens `active` (ascending) whose noisy values are `x_active`
    /// (`n x patch_dim`). Keys and values of every other token come from `cache` (their last
    /// computation: displaced K/V); the active tokens use their fresh ones. With every token
    /// active the cache is not read and this is the ordinary full forward.
    pub fn forward(
        &self,
        x_active: &[f32],
        active: &[u32],
        cond: &StepCond,
        text: &TextContext,
        cache: CacheView<'_>,
        stats: &mut StepStats<'_>,
    ) -> ForwardOut {
        self.forward_inner(x_active, active, cond, text, Some(cache), stats)
    }

    /// Step `n` of `steps` of ordinary sampling: the full forward of the latent `x`, the K/V
    /// written into `cache`, then the Euler update `x <- x - v / steps`. Returns the velocity.
    pub fn full_step(
        &self,
        x: &mut [f32],
        text: &TextContext,
        cache: &mut KvCache,
        n: u32,
        steps: u32,
        stats: &mut StepStats<'_>,
    ) -> Vec<f32> {
        let all: Vec<u32> = (0..self.cfg.tokens() as u32).collect();
        let h = 1.0 / steps as f32;
        let cond = self.step_cond(text, 1.0 - n as f32 * h);
        let out = self.forward(x, &all, &cond, text, cache.view(), stats);
        cache.update(&all, &out);
        for (xi, vi) in x.iter_mut().zip(&out.velocity) {
            *xi -= h * vi;
        }
        out.velocity
    }

    /// Block 0's modulated input for the whole latent `x` (`tokens x patch_dim`): the cheap
    /// signal whole-step caching (TeaCache / first-block cache) watches.
    pub fn first_block_input(&self, x: &[f32], cond: &StepCond) -> Vec<f32> {
        let (d, n) = (self.cfg.d, self.cfg.tokens());
        let mut h = self.apply(self.x_embed, x, n);
        add(&mut h, &self.t(self.pos)[..n * d]);
        layer_norm_f32(&mut h, d, EPS, None, None);
        modulate_f32(&mut h, d, &cond.all[0..d], &cond.all[d..2 * d]);
        h
    }

    /// Forward of the tokens `active` attending only to each other, as if the rest of the
    /// latent did not exist: the NaivePatch baseline (patches denoised independently).
    pub fn forward_isolated(
        &self,
        x_active: &[f32],
        active: &[u32],
        cond: &StepCond,
        text: &TextContext,
        stats: &mut StepStats<'_>,
    ) -> ForwardOut {
        self.forward_inner(x_active, active, cond, text, None, stats)
    }

    fn forward_inner(
        &self,
        x_active: &[f32],
        active: &[u32],
        cond: &StepCond,
        text: &TextContext,
        cache: Option<CacheView<'_>>,
        stats: &mut StepStats<'_>,
    ) -> ForwardOut {
        let cfg = &self.cfg;
        let (d, n, tokens, heads) = (cfg.d, active.len(), cfg.tokens(), cfg.heads);
        assert_eq!(
            x_active.len(),
            n * cfg.patch_dim(),
            "forward: x_active is not n x patch_dim"
        );
        assert!(
            active.windows(2).all(|w| w[0] < w[1])
                && active.last().is_none_or(|&t| (t as usize) < tokens),
            "forward: active must be ascending token ids"
        );
        let all = n == tokens;
        let mut x = self.apply(self.x_embed, x_active, n);
        let pos = self.t(self.pos);
        for (i, &tok) in active.iter().enumerate() {
            add(
                &mut x[i * d..(i + 1) * d],
                &pos[tok as usize * d..(tok as usize + 1) * d],
            );
        }
        assert!(
            all || cache
                .is_none_or(|c| c.k.len() == cfg.depth * tokens * d && c.v.len() == c.k.len()),
            "forward: cache is not depth x tokens x d"
        );
        // Isolated: keys are the active tokens only, grouped as the caller grouped them.
        let own_groups: Option<Vec<u32>> = match (&cache, stats.patch_mass.as_ref()) {
            (None, Some((groups_of, _, _))) => {
                Some(active.iter().map(|&t| groups_of[t as usize]).collect())
            }
            _ => None,
        };
        let nk = if cache.is_some() { tokens } else { n };
        let (mut fk, mut fv) = (Vec::new(), Vec::new());
        let mt = cfg.max_tokens;
        let n_sal = self.saliency_layers.len() as f32;
        let mut cross_probs = stats
            .cross
            .as_ref()
            .map(|_| vec![0.0f32; n * cfg.max_tokens]);
        for (li, b) in self.blocks.iter().enumerate() {
            let m = &cond.all[li * 6 * d..(li + 1) * 6 * d];
            let (sh1, sc1, g1, sh2, sc2, g2) = (
                &m[0..d],
                &m[d..2 * d],
                &m[2 * d..3 * d],
                &m[3 * d..4 * d],
                &m[4 * d..5 * d],
                &m[5 * d..6 * d],
            );
            let mut a = x.clone();
            layer_norm_f32(&mut a, d, EPS, None, None);
            modulate_f32(&mut a, d, sh1, sc1);
            let qkv = self.apply(b.qkv, &a, n);
            let (q, k, v) = split3(&qkv, n, d);
            let (kk, vv) = match cache.filter(|_| !all) {
                None => (k.clone(), v.clone()),
                Some(cache) => {
                    let (mut kk, mut vv) = (
                        cache.k[li * tokens * d..(li + 1) * tokens * d].to_vec(),
                        cache.v[li * tokens * d..(li + 1) * tokens * d].to_vec(),
                    );
                    flashdiff_kernels::scatter_rows_f32(&k, d, active, &mut kk);
                    flashdiff_kernels::scatter_rows_f32(&v, d, active, &mut vv);
                    (kk, vv)
                }
            };
            let mut o = vec![0.0; n * d];
            let mut st = AttnStats::default();
            if let Some((groups_of, groups, mass)) = stats.patch_mass.as_mut() {
                st.group_mass = Some(GroupMass {
                    key_group: own_groups.as_deref().unwrap_or(groups_of),
                    groups: *groups,
                    out: mass,
                    weight: 1.0 / cfg.depth as f32,
                });
            }
            self.backend
                .attention(&q, n, &kk, &vv, nk, d, heads, &mut o, &mut st);
            let p = self.apply(b.proj, &o, n);
            add_gated(&mut x, &p, g1, d);
            fk.push(k);
            fv.push(v);
            let mut a = x.clone();
            layer_norm_f32(&mut a, d, EPS, None, None);
            let cq = self.apply(b.cq, &a, n);
            let mut o = vec![0.0; n * d];
            let mut st = AttnStats::default();
            if let Some(cp) = cross_probs
                .as_mut()
                .filter(|_| self.saliency_layers.contains(&li))
            {
                st.probs = Some((cp, 1.0 / n_sal));
            }
            let (tk, tv) = (
                &text.cross_k[li * mt * d..(li + 1) * mt * d],
                &text.cross_v[li * mt * d..(li + 1) * mt * d],
            );
            self.backend
                .attention(&cq, n, tk, tv, mt, d, heads, &mut o, &mut st);
            add(&mut x, &self.apply(b.cproj, &o, n));
            let mut a = x.clone();
            layer_norm_f32(&mut a, d, EPS, None, None);
            modulate_f32(&mut a, d, sh2, sc2);
            let mut hdn = self.apply(b.fc1, &a, n);
            gelu_tanh_f32(&mut hdn);
            let y = self.apply(b.fc2, &hdn, n);
            add_gated(&mut x, &y, g2, d);
        }
        if let (Some(dst), Some(src)) = (stats.cross.as_mut(), cross_probs) {
            add(dst, &src);
        }
        layer_norm_f32(&mut x, d, EPS, None, None);
        let fm = &cond.all[cfg.depth * 6 * d..];
        modulate_f32(&mut x, d, &fm[0..d], &fm[d..2 * d]);
        let velocity = self.apply(self.final_, &x, n);
        ForwardOut {
            velocity,
            k: fk,
            v: fv,
        }
    }
}

fn add(x: &mut [f32], y: &[f32]) {
    for (a, b) in x.iter_mut().zip(y) {
        *a += b;
    }
}

fn add_gated(x: &mut [f32], y: &[f32], gate: &[f32], d: usize) {
    for (xr, yr) in x.chunks_exact_mut(d).zip(y.chunks_exact(d)) {
        for i in 0..d {
            xr[i] += gate[i] * yr[i];
        }
    }
}

fn split3(qkv: &[f32], n: usize, d: usize) -> (Vec<f32>, Vec<f32>, Vec<f32>) {
    let (mut q, mut k, mut v) = (
        Vec::with_capacity(n * d),
        Vec::with_capacity(n * d),
        Vec::with_capacity(n * d),
    );
    for row in qkv.chunks_exact(3 * d) {
        q.extend_from_slice(&row[..d]);
        k.extend_from_slice(&row[d..2 * d]);
        v.extend_from_slice(&row[2 * d..]);
    }
    (q, k, v)
}

fn split2(kv: &[f32], n: usize, d: usize) -> (Vec<f32>, Vec<f32>) {
    let (mut k, mut v) = (Vec::with_capacity(n * d), Vec::with_capacity(n * d));
    for row in kv.chunks_exact(2 * d) {
        k.extend_from_slice(&row[..d]);
        v.extend_from_slice(&row[d..]);
    }
    (k, v)
}
