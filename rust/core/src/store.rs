//! Object stores: where a remote shard's bytes come from (`s3://`, `gs://`, `az://`/`abfs://`,
//! `https://`, `file://`).
//!
//! Only *where bytes come from* differs between local and remote shards: the catalog still reads
//! every footer once (here: one suffix request per object, plus the offset index), and the reader
//! still decodes one row group with a row selection. For a remote shard the reader asks arrow-rs's
//! push decoder which byte ranges that selection needs (with an offset index: only the pages
//! holding selected rows), fetches them here (coalesced, in parallel) and decodes from memory.
//!
//! Design:
//! * The `object_store` crate does the protocol work: credentials (standard environment
//!   variables, then `storage_options`) and per-attempt timeouts. Retries are ours, one loop per
//!   request ([`Retry`]), with object_store's own turned off: it retries each HTTP request but
//!   not a listing's body, and a second loop around it multiplied the time a dead server took.
//! * Fork safety. DataLoader workers fork after the dataset (and its catalog) exists. A tokio
//!   runtime's threads and an HTTP client's pooled connections do not survive a fork, so both are
//!   per process: the runtime is created on first use in each process (keyed by pid, the parent's
//!   left untouched), and each [`Store`] rebuilds its client when it finds itself in a new one.
//! * Consistency. Every ranged read carries `If-Match: <ETag seen at open>`: an object rewritten
//!   while a job runs is an error naming it, never a mix of old footer and new pages.
//! * Counters ([`Stats`]) are per store, i.e. per dataset and process: requests shardstream made
//!   (after coalescing), payload bytes received, and HTTP attempts that failed and were retried.

use std::collections::BTreeMap;
use std::ops::Range;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use futures::{StreamExt, TryStreamExt};
use object_store::client::{
    HttpClient, HttpConnector, HttpError, HttpRequest, HttpResponse, HttpService,
    SpawnedReqwestConnector,
};
use object_store::path::Path as ObjPath;
use object_store::{
    BackoffConfig, ClientOptions, GetOptions, GetRange, ObjectMeta, ObjectStore, ObjectStoreExt,
    ObjectStoreScheme, RetryConfig,
};
use url::Url;

use crate::error::{Error, Result};

/// Ranges closer than this are fetched as one request. Contiguous pages merge anyway; the gaps
/// that remain are between columns of a partial (resumed) row group, where object_store's 1 MiB
/// default would download skipped pages. pyarrow's S3 pre-buffering uses 8 KiB; 64 KiB keeps a
/// resume lean while merging the small dictionary/data page pairs.
const COALESCE_BYTES: u64 = 64 * 1024;
/// Bytes fetched from the end of an object to read its footer in one request in the common case
/// (pyarrow's default too). A larger footer, or an offset index outside this window, costs one
/// more request; a larger window would cost every shard of a big set its bytes.
pub(crate) const FOOTER_PREFETCH: u64 = 64 * 1024;
/// Objects whose footers are fetched concurrently while opening a catalog.
pub(crate) const FOOTER_CONCURRENCY: usize = 32;

/// Is `source` a URL (as opposed to a local path)?
pub fn is_url(source: &str) -> bool {
    match source.split_once("://") {
        Some((scheme, _)) => {
            !scheme.is_empty()
                && scheme
                    .chars()
                    .all(|c| c.is_ascii_alphanumeric() || c == '+' || c == '-' || c == '.')
        }
        None => false,
    }
}

/// Does an object key name a shard a listing reads (the extensions of a local directory walk)?
fn is_shard_key(key: &str) -> bool {
    let name = key.rsplit('/').next().unwrap_or(key);
    name.rsplit_once('.')
        .is_some_and(|(_, ext)| crate::catalog::sources::SHARD_EXTENSIONS.contains(&ext))
}

/// Cumulative counters of one store in this process.
#[derive(Debug, Default)]
pub struct Stats {
    requests: AtomicU64,
    bytes: AtomicU64,
    retries: AtomicU64,
    http_requests: AtomicU64,
}

/// A snapshot of [`Stats`], summed over a catalog's stores.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct StatsSnapshot {
    /// GET / LIST / HEAD requests shardstream made (ranges already coalesced).
    pub requests: u64,
    /// Payload bytes received (footers, indexes, pages).
    pub bytes: u64,
    /// HTTP attempts that failed (5xx, timeout, dropped connection) and were retried.
    pub retries: u64,
    /// HTTP requests sent, retries included (0 for `file://`).
    pub http_requests: u64,
}

impl std::ops::AddAssign for StatsSnapshot {
    fn add_assign(&mut self, o: Self) {
        self.requests += o.requests;
        self.bytes += o.bytes;
        self.retries += o.retries;
        self.http_requests += o.http_requests;
    }
}

impl Stats {
    fn snapshot(&self) -> StatsSnapshot {
        StatsSnapshot {
            requests: self.requests.load(Ordering::Relaxed),
            bytes: self.bytes.load(Ordering::Relaxed),
            retries: self.retries.load(Ordering::Relaxed),
            http_requests: self.http_requests.load(Ordering::Relaxed),
        }
    }
}

/// The I/O runtime of this process: created on first use, one per process (a forked child gets
/// its own and never touches the parent's, whose threads it does not have). Never dropped:
/// shutting a runtime down can block, and it idles at no cost.
fn runtime() -> Result<tokio::runtime::Handle> {
    static RT: Mutex<Option<(u32, tokio::runtime::Handle)>> = Mutex::new(None);
    let pid = std::process::id();
    let mut slot = RT.lock().unwrap_or_else(|e| e.into_inner());
    if let Some((p, h)) = &*slot {
        if *p == pid {
            return Ok(h.clone());
        }
    }
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .thread_name("shardstream-io")
        .enable_all()
        .build()
        .map_err(|e| Error::Internal(format!("cannot start the I/O runtime: {e}")))?;
    let handle = rt.handle().clone();
    std::mem::forget(rt);
    *slot = Some((pid, handle.clone()));
    Ok(handle)
}

/// Counts HTTP attempts and failed ones around object_store's client (its retry loop calls us
/// once per attempt, so failures seen here are the retried attempts): error statuses, transport
/// errors, and bodies cut off after a good status (counted when the body read fails).
#[derive(Debug)]
struct Counting {
    inner: HttpClient,
    stats: Arc<Stats>,
}

#[async_trait::async_trait]
impl HttpService for Counting {
    async fn call(&self, req: HttpRequest) -> std::result::Result<HttpResponse, HttpError> {
        self.stats.http_requests.fetch_add(1, Ordering::Relaxed);
        let r = self.inner.execute(req).await;
        let failed = match &r {
            Ok(resp) => resp.status().is_server_error() || resp.status().as_u16() == 429,
            Err(_) => true,
        };
        if failed {
            self.stats.retries.fetch_add(1, Ordering::Relaxed);
        }
        let stats = self.stats.clone();
        r.map(|resp| {
            resp.map(|body| {
                object_store::client::HttpResponseBody::new(CountBodyErrors { inner: body, stats })
            })
        })
    }
}

/// A response body that counts a failed read (a connection dropped mid-body) as a failed
/// attempt: object_store re-requests the rest, like any other retried attempt.
struct CountBodyErrors {
    inner: object_store::client::HttpResponseBody,
    stats: Arc<Stats>,
}

impl http_body::Body for CountBodyErrors {
    type Data = Bytes;
    type Error = HttpError;

    fn poll_frame(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Option<std::result::Result<http_body::Frame<Bytes>, HttpError>>> {
        let r = std::pin::Pin::new(&mut self.inner).poll_frame(cx);
        if let std::task::Poll::Ready(Some(Err(_))) = &r {
            self.stats.retries.fetch_add(1, Ordering::Relaxed);
        }
        r
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> http_body::SizeHint {
        self.inner.size_hint()
    }
}

#[derive(Debug)]
struct CountingConnector {
    io: tokio::runtime::Handle,
    stats: Arc<Stats>,
}

impl HttpConnector for CountingConnector {
    fn connect(&self, options: &ClientOptions) -> object_store::Result<HttpClient> {
        let inner = SpawnedReqwestConnector::new(self.io.clone()).connect(options)?;
        Ok(HttpClient::new(Counting {
            inner,
            stats: self.stats.clone(),
        }))
    }
}

/// The retry policy (storage options `max_retries`, `retry_timeout`, `backoff_initial`, with
/// object_store's `timeout` per attempt): the one loop around every request. A request is
/// tried again after a transient failure (5xx, 429, 408, timeout, dropped connection, body cut
/// off) unless `max_retries` retries were made or `retry_timeout` has passed since its first
/// attempt; no attempt starts after that, so a request fails within `retry_timeout + timeout`.
#[derive(Debug, Clone)]
pub(crate) struct Retry {
    max_retries: usize,
    retry_timeout: Duration,
    backoff_initial: Duration,
    /// object_store's per-attempt timeout, when the `timeout` option is one we can read (else
    /// its default): only quoted in errors and docs, object_store enforces it.
    timeout: Duration,
}

/// object_store's default per-attempt timeout (`ClientOptions::default`).
const DEFAULT_TIMEOUT: Duration = Duration::from_secs(30);
/// The longest wait between two attempts.
const MAX_BACKOFF: Duration = Duration::from_secs(15);

impl Default for Retry {
    fn default() -> Self {
        Retry {
            max_retries: 10,
            retry_timeout: Duration::from_secs(180),
            backoff_initial: Duration::from_millis(100),
            timeout: DEFAULT_TIMEOUT,
        }
    }
}

impl Retry {
    /// The wait before retry `n` (0-based): exponential, capped, with "equal jitter" (half
    /// fixed, half random) so that thousands of readers throttled at once do not retry in step.
    fn backoff(&self, n: usize) -> Duration {
        let full = self
            .backoff_initial
            .saturating_mul(1u32 << n.min(16))
            .min(MAX_BACKOFF.max(self.backoff_initial));
        let half = full / 2;
        let r = {
            use std::hash::{BuildHasher, Hasher};
            let mut h = std::collections::hash_map::RandomState::new().build_hasher();
            h.write_usize(n);
            h.finish()
        };
        half + half.mul_f64((r >> 11) as f64 / (1u64 << 53) as f64)
    }

    /// After a failed attempt `attempt` (0-based) that began the request `started` ago: how
    /// long to wait before the next one, or `None` when the budget is spent. The wait never
    /// runs past `retry_timeout`.
    fn next_wait(&self, attempt: usize, started: std::time::Instant) -> Option<Duration> {
        let elapsed = started.elapsed();
        if attempt >= self.max_retries || elapsed >= self.retry_timeout {
            return None;
        }
        Some(self.backoff(attempt).min(self.retry_timeout - elapsed))
    }

    /// What the policy was, for an error message.
    fn describe(&self) -> String {
        format!(
            "max_retries={}, retry_timeout={}, timeout={} per attempt",
            self.max_retries,
            secs(self.retry_timeout),
            secs(self.timeout)
        )
    }
}

fn secs(d: Duration) -> String {
    let s = d.as_secs_f64();
    if s >= 1.0 && s.fract() == 0.0 {
        format!("{s:.0}s")
    } else {
        format!("{}s", format!("{s:.3}").trim_end_matches('0'))
    }
}

fn parse_duration(key: &str, v: &str) -> Result<Duration> {
    let v = v.trim();
    let (num, unit) = v
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .map_or((v, "s"), |i| (&v[..i], v[i..].trim()));
    let n: f64 = num.parse().map_err(|_| {
        Error::Config(format!(
            "storage option {key:?}: expected a duration like \"5s\" or \"250ms\", got {v:?}"
        ))
    })?;
    let secs = match unit {
        "ms" => n / 1000.0,
        "s" | "" => n,
        "m" | "min" => n * 60.0,
        _ => {
            return Err(Error::Config(format!(
                "storage option {key:?}: unknown unit {unit:?} in {v:?} (use ms, s or min)"
            )))
        }
    };
    Ok(Duration::from_secs_f64(secs))
}

/// One object store (scheme + bucket/container/host) with its options, as seen by one catalog.
#[derive(Debug)]
pub struct Store {
    /// `scheme://host` (no path): what error messages and URLs are built from.
    base: String,
    url: Url,
    scheme: ObjectStoreScheme,
    options: BTreeMap<String, String>,
    retry: Retry,
    stats: Arc<Stats>,
    /// The client of the current process (rebuilt after a fork).
    live: Mutex<Option<(u32, Arc<dyn ObjectStore>)>>,
    /// Dictionary pages already fetched (see [`Object::fetch_pages`]).
    dictionaries: Mutex<DictCache>,
}

/// Every piece of a row group needs its columns' dictionary pages (up to 1 MiB each for a
/// high-cardinality column): kept here so the pieces after the first do not download them
/// again. Bounded by bytes, oldest out first; entries are copies, so a cached page never pins a
/// large download buffer.
#[derive(Debug, Default)]
struct DictCache {
    pages: std::collections::HashMap<(ObjPath, u64, u64), Bytes>,
    order: std::collections::VecDeque<(ObjPath, u64, u64)>,
    bytes: usize,
}

const DICT_CACHE_BYTES: usize = 64 << 20;

impl DictCache {
    fn insert(&mut self, key: (ObjPath, u64, u64), page: Bytes) {
        if page.len() > DICT_CACHE_BYTES / 4 || self.pages.contains_key(&key) {
            return;
        }
        self.bytes += page.len();
        self.pages.insert(key.clone(), page);
        self.order.push_back(key);
        while self.bytes > DICT_CACHE_BYTES {
            let Some(old) = self.order.pop_front() else {
                break;
            };
            if let Some(b) = self.pages.remove(&old) {
                self.bytes -= b.len();
            }
        }
    }
}

/// What one URL source names (see [`Store::resolve`]).
#[derive(Debug)]
pub struct Resolved {
    pub objects: Vec<Object>,
    /// The prefix that was listed (`None`: the URL named one object).
    pub listed: Option<ObjPath>,
    /// Objects with the name asked for that the listing came across.
    pub also: Vec<Object>,
    /// The URL was a glob: `objects` are what it matched (not a prefix's shards).
    pub glob: bool,
}

/// One remote shard: its store, key, and the size and ETag seen when the catalog was opened.
#[derive(Debug, Clone)]
pub struct Object {
    pub store: Arc<Store>,
    pub location: ObjPath,
    pub size: u64,
    pub etag: Option<String>,
}

impl Object {
    /// The object's URL, as error messages and `shard_paths` show it.
    pub fn url(&self) -> String {
        self.store.url_of(&self.location)
    }
}

impl Store {
    /// The store for `url` with `options` (object_store configuration keys plus `max_retries`,
    /// `retry_timeout`, `backoff_initial`). Options are checked now: a typo is an error, not a
    /// silently ignored setting.
    pub fn new(url: &Url, options: &BTreeMap<String, String>) -> Result<Arc<Store>> {
        let (scheme, _) = ObjectStoreScheme::parse(url).map_err(|e| {
            Error::Config(format!(
                "unsupported URL {url}: {e} (use s3://, gs://, az://, abfs://, https:// or file://)"
            ))
        })?;
        let mut retry = Retry::default();
        let mut rest = BTreeMap::new();
        for (k, v) in options {
            match k.to_ascii_lowercase().as_str() {
                "max_retries" => {
                    retry.max_retries = v.trim().parse().map_err(|_| {
                        Error::Config(format!(
                            "storage option \"max_retries\": expected an integer, got {v:?}"
                        ))
                    })?
                }
                "retry_timeout" => retry.retry_timeout = parse_duration(k, v)?,
                "backoff_initial" => retry.backoff_initial = parse_duration(k, v)?,
                other => {
                    // object_store enforces it; we only quote it (a form we can't read is
                    // still passed on, and object_store judges it).
                    let bare = ["aws_", "google_", "azure_"]
                        .iter()
                        .find_map(|p| other.strip_prefix(p))
                        .unwrap_or(other);
                    if bare == "timeout" {
                        if let Ok(t) = parse_duration(k, v) {
                            retry.timeout = t;
                        }
                    }
                    rest.insert(other.to_string(), v.clone());
                }
            }
        }
        let base = url[..url::Position::BeforePath].to_string();
        let store = Arc::new(Store {
            base,
            url: url.clone(),
            scheme,
            options: rest,
            retry,
            stats: Arc::new(Stats::default()),
            live: Mutex::new(None),
            dictionaries: Mutex::new(DictCache::default()),
        });
        store.client()?; // validate the options now
        Ok(store)
    }

    /// Two URLs share a store when scheme and host (bucket, container) are equal.
    pub fn serves(&self, url: &Url) -> bool {
        url[..url::Position::BeforePath] == self.base
    }

    pub fn stats(&self) -> StatsSnapshot {
        self.stats.snapshot()
    }

    pub fn url_of(&self, location: &ObjPath) -> String {
        match self.scheme {
            ObjectStoreScheme::Local => format!("file:///{location}"),
            _ => format!("{}/{location}", self.base),
        }
    }

    /// The key a URL names inside this store.
    pub fn location(&self, url: &Url) -> Result<ObjPath> {
        ObjectStoreScheme::parse(url)
            .map(|(_, p)| p)
            .map_err(|e| Error::Config(format!("bad object URL {url}: {e}")))
    }

    fn client(&self) -> Result<Arc<dyn ObjectStore>> {
        let pid = std::process::id();
        let mut live = self.live.lock().unwrap_or_else(|e| e.into_inner());
        if let Some((p, s)) = &*live {
            if *p == pid {
                return Ok(s.clone());
            }
        }
        let s = self.build()?;
        // A client from before a fork is left alone (forgotten), never dropped: its pool's
        // connections belong to the parent's runtime.
        if let Some(old) = live.take() {
            std::mem::forget(old);
        }
        *live = Some((pid, s.clone()));
        Ok(s)
    }

    fn build(&self) -> Result<Arc<dyn ObjectStore>> {
        let io = runtime()?;
        let connector = CountingConnector {
            io,
            stats: self.stats.clone(),
        };
        // object_store's retries are off: [`Store::retrying`] is the one loop (see [`Retry`]).
        let retry = RetryConfig {
            backoff: BackoffConfig::default(),
            max_retries: 0,
            retry_timeout: self.retry.retry_timeout,
        };
        let bad = |k: &str| {
            Error::Config(format!(
                "unknown storage option {k:?} for {} (expected an object_store configuration key \
                 for this scheme, or max_retries / retry_timeout / backoff_initial)",
                self.base
            ))
        };
        let built_err = |e: object_store::Error| {
            Error::Config(format!("cannot configure the store for {}: {e}", self.base))
        };
        let url = self.url.to_string();
        // Each scheme has its own builder type (and config-key enum), configured alike: the
        // user's options, then shardstream's retry policy and counting connector.
        macro_rules! configured {
            ($builder:expr) => {{
                let mut b = $builder;
                for (k, v) in &self.options {
                    b = b.with_config(k.parse().map_err(|_| bad(k))?, v);
                }
                Arc::new(
                    b.with_retry(retry)
                        .with_http_connector(connector)
                        .build()
                        .map_err(built_err)?,
                )
            }};
        }
        let store: Arc<dyn ObjectStore> = match self.scheme {
            ObjectStoreScheme::Local => {
                if let Some(k) = self.options.keys().next() {
                    return Err(bad(k));
                }
                Arc::new(object_store::local::LocalFileSystem::new())
            }
            ObjectStoreScheme::AmazonS3 => {
                configured!(object_store::aws::AmazonS3Builder::from_env().with_url(url))
            }
            ObjectStoreScheme::GoogleCloudStorage => {
                configured!(object_store::gcp::GoogleCloudStorageBuilder::from_env().with_url(url))
            }
            ObjectStoreScheme::MicrosoftAzure => {
                configured!(object_store::azure::MicrosoftAzureBuilder::from_env().with_url(url))
            }
            ObjectStoreScheme::Http => {
                configured!(object_store::http::HttpBuilder::new().with_url(self.base.clone()))
            }
            _ => {
                return Err(Error::Config(format!(
                    "unsupported URL scheme in {} (use s3://, gs://, az://, abfs://, https:// or \
                     file://)",
                    self.base
                )))
            }
        };
        Ok(store)
    }

    /// Run `f` (given this process's client) on the I/O runtime and wait for it. Called from
    /// plain threads (Python's, readahead's), never from inside the runtime.
    pub(crate) fn run<T, F>(&self, f: impl FnOnce(Arc<dyn ObjectStore>) -> F) -> Result<T>
    where
        F: std::future::Future<Output = Result<T>> + Send + 'static,
        T: Send + 'static,
    {
        let client = self.client()?;
        let io = runtime()?;
        let task = io.spawn(f(client));
        io.block_on(task)
            .map_err(|e| Error::Internal(format!("I/O task failed: {e}")))?
    }

    /// Every object `url` names: the object itself, every shard below it (a prefix or
    /// "directory": `*.parquet`, `*.arrow` and the other [`SHARD_EXTENSIONS`]), or, when the
    /// URL's path has glob characters, every object matching it.
    /// Sorted by key; an empty result is an error naming the URL. Objects with a name in `also`
    /// that a listing came across are reported beside them (the catalog's sidecar, an HF
    /// `state.json`: found for free).
    pub fn resolve(self: &Arc<Self>, url: &Url, raw: &str, also: &[&str]) -> Result<Resolved> {
        let key = self.location(url)?;
        let key_str = key.as_ref().to_string();
        let glob_at = key_str.find(['*', '?', '[']);
        // A file:// URL naming a named pipe or device: object_store's local store would open
        // and read it, waiting forever on a FIFO (its listings already skip such files).
        if self.scheme == ObjectStoreScheme::Local && glob_at.is_none() {
            let kind = url
                .to_file_path()
                .ok()
                .and_then(|p| std::fs::metadata(p).ok());
            if let Some(kind) = kind.map(|m| m.file_type()).filter(|k| !k.is_dir()) {
                crate::catalog::check_regular(kind)
                    .map_err(|e| Error::io(std::path::Path::new(raw), e))?;
            }
        }
        let store = self.clone();
        let raw_owned = raw.to_string();
        let also: Vec<String> = also.iter().map(|a| format!("/{a}")).collect();
        let is_also = move |m: &ObjectMeta| {
            let at = m.location.as_ref();
            also.iter()
                .any(|a| at.ends_with(a.as_str()) || at == &a[1..])
        };
        type Found = (Vec<ObjectMeta>, Option<ObjPath>, Vec<ObjectMeta>);
        let (metas, listed, extra): Found = self.run(move |client| async move {
            let stats = store.stats.clone();
            let list = |prefix: ObjPath| {
                let (client, store) = (client.clone(), store.clone());
                let raw = raw_owned.clone();
                async move {
                    let p = (!prefix.as_ref().is_empty()).then_some(prefix);
                    store.list_retrying(&client, p.as_ref(), &raw).await
                }
            };
            // One HEAD of `key`, retried; a missing object is `None` where `missing_ok`.
            let head = |missing_ok: bool| {
                let (client, store, key) = (client.clone(), store.clone(), key.clone());
                let raw = raw_owned.clone();
                stats.requests.fetch_add(1, Ordering::Relaxed);
                async move {
                    store
                        .retrying(&raw, || {
                            let (client, key) = (client.clone(), key.clone());
                            async move {
                                match client.head(&key).await {
                                    Ok(m) => Ok(Some(m)),
                                    Err(object_store::Error::NotFound { .. }) if missing_ok => {
                                        Ok(None)
                                    }
                                    Err(e) => Err(e),
                                }
                            }
                        })
                        .await
                }
            };
            // Plain HTTP has no listing (object_store would try WebDAV): a URL is one object.
            let http = store.scheme == ObjectStoreScheme::Http;
            if http && glob_at.is_some() {
                return Err(Error::Config(format!(
                    "{raw_owned}: http(s) URLs cannot be globbed (no listing); name the objects"
                )));
            }
            if let Some(at) = glob_at {
                let prefix = ObjPath::from(key_str[..at].rsplit_once('/').map_or("", |(p, _)| p));
                let pattern = glob::Pattern::new(&key_str)
                    .map_err(|e| Error::Config(format!("bad glob {raw_owned:?}: {e}")))?;
                let opts = glob::MatchOptions {
                    require_literal_separator: true,
                    ..Default::default()
                };
                let all = list(prefix.clone()).await?;
                let extra = all.iter().filter(|m| is_also(m)).cloned().collect();
                let matched = all
                    .into_iter()
                    .filter(|m| pattern.matches_with(m.location.as_ref(), opts))
                    .collect();
                return Ok((matched, Some(prefix), extra));
            }
            if http || is_shard_key(&key_str) {
                // not an object: maybe a prefix (listed below); plain HTTP has no prefixes
                if let Some(m) = head(!http).await? {
                    return Ok((vec![m], None, Vec::new()));
                }
            }
            let all = list(key.clone()).await?;
            let extra = all.iter().filter(|m| is_also(m)).cloned().collect();
            let matched: Vec<ObjectMeta> = all
                .into_iter()
                .filter(|m| is_shard_key(m.location.as_ref()))
                .collect();
            if matched.is_empty() && !key_str.is_empty() {
                // Nothing below it: maybe one object with another name (told by its magic).
                if let Some(m) = head(true).await? {
                    return Ok((vec![m], None, Vec::new()));
                }
            }
            Ok((matched, Some(key), extra))
        })?;
        if metas.is_empty() {
            return Err(Error::NotFound {
                path: raw.to_string(),
                what: if glob_at.is_some() {
                    "no objects match the glob".into()
                } else {
                    "no such object, and no Parquet or Arrow IPC objects (*.parquet, *.arrow, \
                     *.feather, *.arrows, *.ipc) under that prefix"
                        .into()
                },
            });
        }
        let object = |m: ObjectMeta| Object {
            store: self.clone(),
            location: m.location,
            size: m.size,
            etag: m.e_tag,
        };
        let mut out: Vec<Object> = metas.into_iter().map(object).collect();
        out.sort_by(|a, b| {
            std::path::Path::new(a.location.as_ref()).cmp(std::path::Path::new(b.location.as_ref()))
        });
        Ok(Resolved {
            objects: out,
            listed,
            also: extra.into_iter().map(object).collect(),
            glob: glob_at.is_some(),
        })
    }

    /// Does a listing of `prefix` (object_store's prefix: whole path segments) see `key`?
    pub(crate) fn covers(prefix: &ObjPath, key: &ObjPath) -> bool {
        prefix.as_ref().is_empty() || key.prefix_match(prefix).is_some()
    }

    /// The whole object at `location` (one GET under the retry policy), or `None` if there is
    /// none. For small files read whole (the sidecar).
    pub(crate) fn get_whole(
        self: &Arc<Self>,
        location: &ObjPath,
        what: &str,
    ) -> Result<Option<Bytes>> {
        let location = location.clone();
        let what = what.to_string();
        let stats = self.stats.clone();
        let me = self.clone();
        self.run(move |client| async move {
            stats.requests.fetch_add(1, Ordering::Relaxed);
            let got = me
                .retrying(&what, || {
                    let (client, location) = (client.clone(), location.clone());
                    async move {
                        match client.get(&location).await {
                            Ok(r) => r.bytes().await.map(Some),
                            Err(object_store::Error::NotFound { .. }) => Ok(None),
                            Err(e) => Err(e),
                        }
                    }
                })
                .await?;
            if let Some(b) = &got {
                stats.bytes.fetch_add(b.len() as u64, Ordering::Relaxed);
            }
            Ok(got)
        })
    }

    /// Write `data` to `location` (one PUT under the retry policy; object stores replace an
    /// object whole, so readers see the old or the new one).
    pub(crate) fn put_whole(
        self: &Arc<Self>,
        location: &ObjPath,
        data: Bytes,
        what: &str,
    ) -> Result<()> {
        let location = location.clone();
        let what = what.to_string();
        let stats = self.stats.clone();
        let me = self.clone();
        self.run(move |client| async move {
            stats.requests.fetch_add(1, Ordering::Relaxed);
            me.retrying(&what, || {
                let (client, location, data) = (client.clone(), location.clone(), data.clone());
                async move { client.put(&location, data.into()).await.map(|_| ()) }
            })
            .await
        })
    }

    /// Run `op` (one attempt of a request, a fresh future each call) under the retry policy:
    /// transient failures are tried again until [`Retry`] says stop. `what` names the object
    /// or URL in errors.
    pub(crate) async fn retrying<T, F, Fut>(&self, what: &str, mut op: F) -> Result<T>
    where
        F: FnMut() -> Fut,
        Fut: std::future::Future<Output = object_store::Result<T>>,
    {
        let started = std::time::Instant::now();
        let mut attempt = 0;
        loop {
            let e = match op().await {
                Ok(v) => return Ok(v),
                Err(e) => e,
            };
            if !self.transient(&e) {
                return Err(self.error(what, e));
            }
            match self.retry.next_wait(attempt, started) {
                Some(wait) => tokio::time::sleep(wait).await,
                None => return Err(self.gave_up(what, e, attempt + 1, started.elapsed())),
            }
            attempt += 1;
        }
    }

    /// Every object below `prefix`, under the retry policy. A listing is one request per page
    /// and object_store does not retry a page whose body breaks off, so a failed listing goes
    /// on after the last key received (S3, GCS and Azure list in key order) rather than from
    /// the start; keys received since the last failure are progress and renew the budget.
    async fn list_retrying(
        &self,
        client: &Arc<dyn ObjectStore>,
        prefix: Option<&ObjPath>,
        what: &str,
    ) -> Result<Vec<ObjectMeta>> {
        let ordered = matches!(
            self.scheme,
            ObjectStoreScheme::AmazonS3
                | ObjectStoreScheme::GoogleCloudStorage
                | ObjectStoreScheme::MicrosoftAzure
        );
        let mut out: Vec<ObjectMeta> = Vec::new();
        let mut started = std::time::Instant::now();
        let mut attempt = 0;
        self.stats.requests.fetch_add(1, Ordering::Relaxed);
        loop {
            let after = if ordered {
                out.last().map(|m| m.location.clone())
            } else {
                out.clear();
                None
            };
            let mut stream = match &after {
                Some(a) => client.list_with_offset(prefix, a),
                None => client.list(prefix),
            };
            let mut failed = None;
            while let Some(item) = stream.next().await {
                match item {
                    // a store that ignored the offset repeats keys: skip them
                    Ok(m) if after.as_ref().is_some_and(|a| m.location <= *a) => {}
                    Ok(m) => {
                        out.push(m);
                        if ordered {
                            (started, attempt) = (std::time::Instant::now(), 0);
                        }
                    }
                    Err(e) => {
                        failed = Some(e);
                        break;
                    }
                }
            }
            let Some(e) = failed else { return Ok(out) };
            if !self.transient(&e) {
                return Err(self.error(what, e));
            }
            match self.retry.next_wait(attempt, started) {
                Some(wait) => tokio::time::sleep(wait).await,
                None => return Err(self.gave_up(what, e, attempt + 1, started.elapsed())),
            }
            attempt += 1;
        }
    }

    /// Errors worth another attempt: 5xx, 429, 408, and transport failures (connect, timeout,
    /// reset, a body cut off); not: missing, forbidden, changed, a bad request, a local file.
    fn transient(&self, e: &object_store::Error) -> bool {
        use object_store::Error as E;
        if self.scheme == ObjectStoreScheme::Local {
            return false;
        }
        match e {
            E::Generic { source, .. } => {
                if let Some(status) = status_in(&**source) {
                    return status >= 500 || status == 429 || status == 408;
                }
                let mut src: Option<&(dyn std::error::Error + 'static)> = Some(&**source);
                while let Some(s) = src {
                    if let Some(h) = s.downcast_ref::<object_store::client::HttpError>() {
                        // Unknown: reqwest's builder errors (e.g. http:// refused), not the network
                        return h.kind() != object_store::client::HttpErrorKind::Unknown;
                    }
                    src = s.source();
                }
                // Unrecognised (a credential fetch, a malformed answer): worth the bounded retry.
                true
            }
            E::NotFound { .. }
            | E::PermissionDenied { .. }
            | E::Unauthenticated { .. }
            | E::Precondition { .. }
            | E::NotModified { .. }
            | E::NotSupported { .. }
            | E::InvalidPath { .. }
            | E::AlreadyExists { .. }
            | E::NotImplemented { .. }
            | E::UnknownConfigurationKey { .. } => false,
            _ => false,
        }
    }

    /// The error of a request that failed transiently until the policy said stop: how many
    /// attempts, how long, under which limits, and the last failure.
    fn gave_up(
        &self,
        what: &str,
        e: object_store::Error,
        attempts: usize,
        took: Duration,
    ) -> Error {
        let text = chain_text(&e);
        let kind = if text.contains("timed out") || text.contains("timeout") {
            std::io::ErrorKind::TimedOut
        } else {
            std::io::ErrorKind::Other
        };
        Error::Io {
            path: what.to_string(),
            source: std::io::Error::new(
                kind,
                format!(
                    "gave up after {attempts} attempt{} in {:.1} s ({}): {e}",
                    if attempts == 1 { "" } else { "s" },
                    took.as_secs_f64(),
                    self.retry.describe()
                ),
            ),
        }
    }

    /// An object_store error as a core error naming the object or URL.
    pub(crate) fn error(&self, what: &str, e: object_store::Error) -> Error {
        use object_store::Error as E;
        // reqwest refuses http:// unless allowed, saying only "builder error".
        if chain_text(&e).contains("URL scheme is not allowed") {
            let env = match self.scheme {
                ObjectStoreScheme::AmazonS3 => " (or AWS_ALLOW_HTTP=true in the environment)",
                _ => "",
            };
            return Error::Config(format!(
                "{what}: the endpoint is plain http://, which is refused unless the storage \
                 option \"allow_http\" is \"true\"{env}"
            ));
        }
        // Listing errors arrive as `Generic` with the HTTP status only in their text.
        let e = match e {
            E::Generic { store, source } => match status_in(&*source) {
                Some(404) => E::NotFound {
                    path: what.to_string(),
                    source,
                },
                Some(401) => E::Unauthenticated {
                    path: what.to_string(),
                    source,
                },
                Some(403) => E::PermissionDenied {
                    path: what.to_string(),
                    source,
                },
                _ => E::Generic { store, source },
            },
            e => e,
        };
        match e {
            E::NotFound { .. } => Error::NotFound {
                path: what.to_string(),
                what: "no such object or bucket".into(),
            },
            E::PermissionDenied { .. } | E::Unauthenticated { .. } => Error::Io {
                path: what.to_string(),
                source: std::io::Error::new(std::io::ErrorKind::PermissionDenied, e.to_string()),
            },
            E::Precondition { .. } => Error::Shard {
                path: what.to_string(),
                message: "changed since the dataset was opened (its ETag no longer matches): \
                          the data of a running job must not be rewritten; reopen the dataset"
                    .into(),
            },
            other => Error::Io {
                path: what.to_string(),
                source: std::io::Error::other(other.to_string()),
            },
        }
    }
}

/// An error's message with those of its sources.
fn chain_text(e: &(dyn std::error::Error + 'static)) -> String {
    let mut text = e.to_string();
    let mut src = e.source();
    while let Some(s) = src {
        text.push_str(": ");
        text.push_str(&s.to_string());
        src = s.source();
    }
    text
}

/// The HTTP status an error's message chain reports ("... status code: 503 ..." from
/// object_store's request errors, "... 404 Not Found ..." from its listing errors), if any.
fn status_in(e: &(dyn std::error::Error + 'static)) -> Option<u16> {
    let text = chain_text(e);
    if let Some(at) = text.find("status code: ") {
        let digits = text[at + 13..].get(..3)?;
        if let Ok(code) = digits.parse::<u16>() {
            return Some(code);
        }
    }
    for (code, reason) in [
        (404, "Not Found"),
        (403, "Forbidden"),
        (401, "Unauthorized"),
    ] {
        if text.contains(&format!("{code} {reason}")) {
            return Some(code);
        }
    }
    None
}

/// Fetch `ranges` of `obj` (any order; returned in the same order). Ranges closer than
/// [`COALESCE_BYTES`] share one request; up to 10 requests run in parallel. Every request is
/// conditional on the ETag seen at open.
pub(crate) async fn fetch_ranges(
    client: Arc<dyn ObjectStore>,
    obj: Object,
    ranges: Vec<Range<u64>>,
) -> Result<Vec<Bytes>> {
    let stats = obj.store.stats.clone();
    let get = |r: Range<u64>| {
        let (client, obj, stats) = (client.clone(), obj.clone(), stats.clone());
        async move {
            let opts = GetOptions {
                if_match: obj.etag.clone(),
                range: Some(GetRange::Bounded(r.clone())),
                ..Default::default()
            };
            stats.requests.fetch_add(1, Ordering::Relaxed);
            let bytes = obj
                .store
                .retrying(&obj.url(), || {
                    let (client, opts) = (client.clone(), opts.clone());
                    let location = obj.location.clone();
                    async move { client.get_opts(&location, opts).await?.bytes().await }
                })
                .await?;
            if bytes.len() as u64 != r.end - r.start {
                return Err(Error::Shard {
                    path: obj.url(),
                    message: format!(
                        "asked for bytes {}..{} and got {} bytes (object truncated?)",
                        r.start,
                        r.end,
                        bytes.len()
                    ),
                });
            }
            stats.bytes.fetch_add(bytes.len() as u64, Ordering::Relaxed);
            Ok::<Bytes, Error>(bytes)
        }
    };
    object_store::coalesce_ranges(&ranges, get, COALESCE_BYTES).await
}

impl Object {
    /// Blocking [`fetch_ranges`] on the I/O runtime.
    pub fn fetch(&self, ranges: Vec<Range<u64>>) -> Result<Vec<Bytes>> {
        let obj = self.clone();
        self.store
            .run(move |client| fetch_ranges(client, obj, ranges))
    }

    /// [`Object::fetch`] for the page ranges a decoder asks for, where `dictionaries` are the
    /// byte ranges of dictionary pages in them: those come from (and go to) the store's cache.
    /// The cache lock is only tried, never waited for: a lock held by a thread that vanished in
    /// a fork must not block the child, so contention just means a download.
    pub fn fetch_pages(
        &self,
        ranges: Vec<Range<u64>>,
        dictionaries: &[Range<u64>],
    ) -> Result<Vec<Bytes>> {
        let key = |r: &Range<u64>| (self.location.clone(), r.start, r.end);
        let is_dict = |r: &Range<u64>| dictionaries.contains(r);
        let mut out: Vec<Option<Bytes>> = match self.store.dictionaries.try_lock() {
            Ok(cache) => ranges
                .iter()
                .map(|r| {
                    is_dict(r)
                        .then(|| cache.pages.get(&key(r)).cloned())
                        .flatten()
                })
                .collect(),
            Err(_) => vec![None; ranges.len()],
        };
        let missing: Vec<Range<u64>> = ranges
            .iter()
            .zip(&out)
            .filter(|(_, o)| o.is_none())
            .map(|(r, _)| r.clone())
            .collect();
        if missing.is_empty() {
            return Ok(out.into_iter().flatten().collect());
        }
        let mut got = self.fetch(missing)?.into_iter();
        let mut cache = self.store.dictionaries.try_lock().ok();
        for (r, slot) in ranges.iter().zip(out.iter_mut()) {
            if slot.is_none() {
                let b = got.next().expect("one buffer per missing range");
                if let (true, Some(c)) = (is_dict(r), cache.as_mut()) {
                    c.insert(key(r), Bytes::copy_from_slice(&b));
                }
                *slot = Some(b);
            }
        }
        Ok(out.into_iter().flatten().collect())
    }

    /// The last `n` bytes' range (the whole object if smaller).
    pub(crate) fn suffix(&self, n: u64) -> Range<u64> {
        self.size.saturating_sub(n)..self.size
    }
}

/// Run `f` over `items` with at most `n` in flight, on `store`'s runtime, in order.
pub(crate) fn run_buffered<I, T, F, Fut>(
    store: &Store,
    items: Vec<I>,
    n: usize,
    f: F,
) -> Result<Vec<T>>
where
    I: Send + 'static,
    T: Send + 'static,
    F: Fn(Arc<dyn ObjectStore>, I) -> Fut + Send + Sync + 'static,
    Fut: std::future::Future<Output = Result<T>> + Send + 'static,
{
    store.run(move |client| async move {
        futures::stream::iter(items)
            .map(|i| f(client.clone(), i))
            .buffered(n.max(1))
            .try_collect()
            .await
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn urls_and_durations() {
        assert!(is_url("s3://b/k"));
        assert!(is_url("file:///tmp/x"));
        assert!(!is_url("/tmp/x"));
        assert!(!is_url("data/*.parquet"));
        assert_eq!(
            parse_duration("t", "250ms").unwrap(),
            Duration::from_millis(250)
        );
        assert_eq!(parse_duration("t", "5").unwrap(), Duration::from_secs(5));
        assert_eq!(
            parse_duration("t", "2 min").unwrap(),
            Duration::from_secs(120)
        );
        assert!(parse_duration("t", "fast").is_err());
        assert!(parse_duration("t", "5h").is_err());
    }

    #[test]
    fn dictionary_cache_is_bounded_oldest_out() {
        let mut c = DictCache::default();
        let page = |n: usize| Bytes::from(vec![0u8; n]);
        let key = |i: u64| (ObjPath::from("a.parquet"), i, i + 1);
        c.insert(key(0), page(DICT_CACHE_BYTES / 4 + 1)); // too big for the cache: not kept
        assert!(c.pages.is_empty());
        for i in 0..5 {
            c.insert(key(i), page(DICT_CACHE_BYTES / 4));
        }
        assert!(c.bytes <= DICT_CACHE_BYTES);
        assert!(!c.pages.contains_key(&key(0)), "the oldest page goes first");
        assert!(c.pages.contains_key(&key(4)));
        assert_eq!(c.pages.len(), 4);
    }

    #[test]
    fn retry_waits_grow_and_never_pass_the_deadline() {
        let r = Retry {
            max_retries: 5,
            retry_timeout: Duration::from_millis(900),
            backoff_initial: Duration::from_millis(100),
            timeout: Duration::from_secs(1),
        };
        for n in 0..5 {
            let full = Duration::from_millis(100 << n).min(MAX_BACKOFF);
            let w = r.backoff(n);
            assert!(
                w >= full / 2 && w <= full,
                "retry {n}: {w:?} not in [{:?}, {full:?}]",
                full / 2
            );
        }
        assert!(r.backoff(40) <= MAX_BACKOFF, "capped");
        let now = std::time::Instant::now();
        assert!(r.next_wait(0, now).unwrap() <= Duration::from_millis(100));
        assert_eq!(r.next_wait(5, now), None, "max_retries reached");
        let long_ago = now - Duration::from_millis(850);
        let w = r.next_wait(3, long_ago).unwrap();
        assert!(
            w <= Duration::from_millis(50),
            "a wait ends by retry_timeout: {w:?}"
        );
        assert_eq!(
            r.next_wait(1, now - Duration::from_secs(1)),
            None,
            "retry_timeout passed"
        );
        assert!(r
            .describe()
            .contains("max_retries=5, retry_timeout=0.9s, timeout=1s"));
    }

    #[test]
    fn statuses_are_read_from_error_messages() {
        let e = |m: &str| -> Box<dyn std::error::Error> { m.to_string().into() };
        let got = |m: &str| status_in(&*e(m));
        assert_eq!(
            got("Server returned non-2xx status code: 503 Service Unavailable: x"),
            Some(503)
        );
        assert_eq!(
            got("Error performing list request: ... 404 Not Found"),
            Some(404)
        );
        assert_eq!(got("HTTP error: error sending request"), None);
    }

    #[test]
    fn unknown_option_is_an_error_naming_it() {
        let url = Url::parse("s3://bucket/prefix/").unwrap();
        let mut opts = BTreeMap::new();
        opts.insert("aws_region".to_string(), "us-east-1".to_string());
        opts.insert("aws_endpoit".to_string(), "http://x".to_string());
        let err = Store::new(&url, &opts).unwrap_err().to_string();
        assert!(err.contains("aws_endpoit"), "{err}");
    }
}
