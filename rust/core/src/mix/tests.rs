//! Properties of mixed streams against the uninterrupted run, over real shards: exact resume
//! anywhere (twice), exactly once per source-epoch, elastic layouts, weight changes and
//! added/removed sources on resume, exhaustion policies, edge cases.

use std::sync::Arc;

use arrow_array::{Array, Int32Array, Int64Array};
use proptest::prelude::*;

use super::rule::Mixing;
use super::schedule::Kind;
use super::*;
use crate::error::Error;
use crate::plan::Even;
use crate::resume::Resume;
use crate::settings::{Layout, Settings, Tuning};
use crate::stream::Stream;
use crate::test_util::write_shards;

/// Sources `a`, `b`, ... with `rows[i]` rows in shards of `rg`-row row groups.
struct Fixture {
    _dir: tempfile::TempDir,
    catalogs: Vec<Arc<Catalog>>,
}

fn fixture(rows: &[Vec<usize>]) -> Fixture {
    let dir = tempfile::tempdir().unwrap();
    let mut catalogs = Vec::new();
    for (i, r) in rows.iter().enumerate() {
        let d = dir.path().join(format!("src{i}"));
        std::fs::create_dir(&d).unwrap();
        let files = write_shards(&d, r, 5);
        catalogs.push(Arc::new(Catalog::open(&files, None).unwrap()));
    }
    Fixture {
        _dir: dir,
        catalogs,
    }
}

fn name(i: usize) -> String {
    ((b'a' + i as u8) as char).to_string()
}

#[derive(Debug, Clone)]
struct Spec {
    weights: Vec<f64>,
    policies: Vec<(OnExhausted, Option<u64>)>,
    shuffle: Vec<usize>,
    mixing: Mixing,
    batch: Option<u64>,
    drop_last: bool,
    even: Even,
    samples: Option<u64>,
    combine: Combine,
}

fn spec(k: usize) -> Spec {
    Spec {
        weights: vec![1.0; k],
        policies: vec![(OnExhausted::Drop, Some(2)); k],
        shuffle: vec![0; k],
        mixing: Mixing::Deterministic,
        batch: Some(3),
        drop_last: false,
        even: Even::Off,
        samples: None,
        combine: Combine::Mixed,
    }
}

fn config(f: &Fixture, s: &Spec, only: Option<&[usize]>) -> Arc<MixConfig> {
    Arc::new(try_config(f, s, only).unwrap())
}

fn try_config(f: &Fixture, s: &Spec, only: Option<&[usize]>) -> Result<MixConfig> {
    let idx: Vec<usize> = match only {
        Some(o) => o.to_vec(),
        None => (0..s.weights.len()).collect(),
    };
    let sources = idx
        .iter()
        .map(|&i| MixSource {
            name: name(i),
            catalog: f.catalogs[i].clone(),
            settings: Settings {
                seed: 11 + i as u64,
                shuffle_buffer: s.shuffle[i],
                batch_size: None,
                drop_last: false,
                epochs: None,
                even: s.even,
                pack: None,
            },
            tuning: Tuning {
                read_batch_rows: Some(4),
                ..Tuning::default()
            },
            on_exhausted: s.policies[i].0,
            max_epochs: s.policies[i].1,
        })
        .collect();
    let weights = WeightsArg {
        kind: Kind::Step,
        points: vec![(0, idx.iter().map(|&i| (name(i), s.weights[i])).collect())],
    };
    MixConfig::new(
        sources,
        MixSettings {
            seed: 5,
            mixing: s.mixing,
            batch_size: s.batch,
            drop_last: s.drop_last,
            even: s.even,
            samples: s.samples,
        },
        weights,
        s.combine,
        Some("source".into()),
    )
}

/// A stratified block's counts and served order are laid out when it starts, before its first
/// item (10^7 items: 0.7 s and 18 MiB), so a block of 10^12 items with endless sources hung the
/// first item. Blocks are refused above `MAX_STRATIFIED_BLOCK`, and empty ones.
#[test]
fn stratified_block_sizes_are_bounded() {
    let f = fixture(&[vec![3], vec![2]]);
    let mut s = spec(2);
    for (b, ok) in [
        (0, false),
        (1, true),
        (MAX_STRATIFIED_BLOCK, true),
        (MAX_STRATIFIED_BLOCK + 1, false),
        (u64::MAX >> 1, false),
    ] {
        s.mixing = Mixing::Stratified(b);
        match try_config(&f, &s, None) {
            Ok(_) => assert!(ok, "block {b} was accepted"),
            Err(e) => {
                assert!(!ok, "block {b}: {e}");
                let want = format!("block must be an int in [1, {MAX_STRATIFIED_BLOCK}]");
                assert!(e.to_string().contains(&want), "{e}");
            }
        }
    }
}

/// `(source name, id)` of each row of an item.
fn rows_of(cfg: &MixConfig, item: &MixItem) -> Vec<(String, i64)> {
    let names = cfg.names();
    match item {
        MixItem::Mixed(b) => {
            let tags = b
                .column_by_name("source")
                .unwrap()
                .as_any()
                .downcast_ref::<Int32Array>()
                .unwrap();
            let ids = b
                .column_by_name("id")
                .unwrap()
                .as_any()
                .downcast_ref::<Int64Array>()
                .unwrap();
            (0..b.num_rows())
                .map(|i| (names[tags.value(i) as usize].clone(), ids.value(i)))
                .collect()
        }
        MixItem::Parts { tags, parts } => {
            let mut next = vec![0usize; parts.len()];
            tags.iter()
                .map(|&t| {
                    let b = parts[t as usize].as_ref().unwrap();
                    let ids = b
                        .column_by_name("id")
                        .unwrap()
                        .as_any()
                        .downcast_ref::<Int64Array>()
                        .unwrap();
                    let r = next[t as usize];
                    next[t as usize] += 1;
                    (names[t as usize].clone(), ids.value(r))
                })
                .collect()
        }
    }
}

fn layout(i: u64, n: u64, even: Even) -> Layout {
    Layout::new(i, n, 0, 1, even).unwrap()
}

fn open(cfg: &Arc<MixConfig>, l: Layout, r: &MixResume) -> MixStream {
    MixStream::resume(cfg.clone(), l, None, r).unwrap()
}

fn drain(cfg: &MixConfig, s: &mut MixStream) -> Vec<Vec<(String, i64)>> {
    let mut out = Vec::new();
    while let Some(it) = s.next_item().unwrap() {
        out.push(rows_of(cfg, &it));
    }
    out
}

/// The rows a plain stream of `src` (the mixture's settings for it) yields in `l`, `epochs` of
/// them: what a source's rows in a mixture must be, in order.
fn plain(cfg: &MixConfig, i: usize, l: Layout, epochs: u64) -> Vec<i64> {
    let src = &cfg.sources[i];
    let st = Settings {
        epochs: Some(epochs),
        ..src.settings.clone()
    };
    let mut s = Stream::resume(
        src.catalog.clone(),
        &st,
        &src.tuning,
        l,
        0,
        &Resume::start(0),
    )
    .unwrap();
    let mut out = Vec::new();
    while let Some(b) = s.next_batch(7).unwrap() {
        out.extend(crate::test_util::ids(&b));
    }
    out
}

fn per_source(rows: &[(String, i64)], n: &str) -> Vec<i64> {
    rows.iter()
        .filter(|(s, _)| s == n)
        .map(|(_, i)| *i)
        .collect()
}

fn spec_strategy() -> impl Strategy<Value = (Vec<Vec<usize>>, Spec)> {
    (1usize..4).prop_flat_map(|k| {
        (
            proptest::collection::vec(proptest::collection::vec(0usize..25, 1..3), k),
            proptest::collection::vec(prop_oneof![Just(0.0), 0.05f64..1.0, Just(1.0)], k),
            proptest::collection::vec(
                prop_oneof![
                    Just((OnExhausted::Cycle, Some(2))),
                    Just((OnExhausted::Drop, Some(1))),
                    Just((OnExhausted::Drop, Some(3))),
                    Just((OnExhausted::Stop, Some(2))),
                ],
                k,
            ),
            proptest::collection::vec(prop_oneof![Just(0usize), 1usize..12], k),
            0u8..3,
            1u64..5,
            prop_oneof![Just(None), (1u64..6).prop_map(Some)],
            any::<bool>(),
        )
            .prop_map(
                move |(rows, mut w, pol, shuffle, mode, block, batch, drop_last)| {
                    if w.iter().all(|x| *x == 0.0) {
                        w[0] = 1.0;
                    }
                    let mixing = [
                        Mixing::Deterministic,
                        Mixing::Stratified(block),
                        Mixing::Random,
                    ][mode as usize];
                    let policies = pol
                        .into_iter()
                        .map(|p| {
                            if mixing == Mixing::Random && p.0 == OnExhausted::Stop {
                                (OnExhausted::Drop, p.1)
                            } else {
                                p
                            }
                        })
                        .collect();
                    let s = Spec {
                        weights: w,
                        policies,
                        shuffle,
                        mixing,
                        batch,
                        drop_last: drop_last && batch.is_some(),
                        even: Even::Off,
                        samples: Some(150),
                        combine: if batch.is_some() && !drop_last {
                            Combine::BySource
                        } else {
                            Combine::Mixed
                        },
                    };
                    (rows, s)
                },
            )
    })
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 40, ..ProptestConfig::default() })]

    /// `pass_ended` (decided on coordinates) says exactly whether the next item is `None`,
    /// before every item of a run and for a stream resumed from the state saved there (what
    /// the Python layer asks of a loaded state), `samples`, `stop` sources and `drop_last`
    /// included.
    #[test]
    fn pass_ended_is_whether_the_next_item_is_none((rows, mut s) in spec_strategy(), few in any::<bool>()) {
        if few {
            s.samples = Some(7); // the end by `samples`, often inside a batch
        }
        let f = fixture(&rows);
        let cfg = config(&f, &s, None);
        let l = layout(0, 1, s.even);
        let mut a = open(&cfg, l, &MixResume::start(&cfg));
        loop {
            let ended = a.pass_ended();
            let saved = a.checkpoint(None).unwrap().to_value();
            let r = MixResume::load(&cfg, vec![saved], false, true).unwrap();
            prop_assert_eq!(r.pass_ended(&cfg, l).unwrap(), ended);
            let next = a.next_item().unwrap();
            prop_assert_eq!(ended, next.is_none());
            if next.is_none() {
                prop_assert!(a.pass_ended());
                break;
            }
        }
    }

    /// A state saved after any item (in row mode, after any row of a chunk), loaded from its
    /// plain form, continues exactly as the uninterrupted run; and again from a second state
    /// saved after that resume.
    #[test]
    fn resumes_anywhere_twice(
        (rows, s) in spec_strategy(), cut in 0usize..40, within in 0usize..40, cut2 in 0usize..10,
    ) {
        let f = fixture(&rows);
        let cfg = config(&f, &s, None);
        let l = layout(0, 1, s.even);
        let start = MixResume::start(&cfg);
        let all: Vec<(String, i64)> = drain(&cfg, &mut open(&cfg, l, &start)).concat();
        let mut a = open(&cfg, l, &start);
        let mut seen = Vec::new();
        for _ in 0..cut {
            match a.next_item().unwrap() { Some(it) => seen.push(rows_of(&cfg, &it)), None => break }
        }
        // Row mode: stop `within` rows into the last chunk.
        let w = match (s.batch, seen.last()) {
            (None, Some(last)) if within < last.len() => Some(within),
            _ => None,
        };
        let mut at: usize = seen.iter().map(Vec::len).sum();
        if let Some(w) = w { at -= seen.last().unwrap().len() - w; }
        let saved = a.checkpoint(w).unwrap().to_value();
        let r = MixResume::load(&cfg, vec![saved], false, true).unwrap();
        let mut b = open(&cfg, l, &r);
        let mut rest = Vec::new();
        for _ in 0..cut2 {
            match b.next_item().unwrap() { Some(it) => rest.extend(rows_of(&cfg, &it)), None => break }
        }
        let again = b.checkpoint(None).unwrap().to_value();
        rest.extend(drain(&cfg, &mut b).concat());
        prop_assert_eq!(&rest[..], &all[at..]);
        let r2 = MixResume::load(&cfg, vec![again], false, true).unwrap();
        let tail = drain(&cfg, &mut open(&cfg, l, &r2)).concat();
        prop_assert_eq!(&tail[..], &all[all.len() - tail.len()..]);
    }

    /// Over every slot of a layout, each source's rows are its plain stream's rows of that slot,
    /// in order (cursors), and each row appears once per source-epoch that ran (the prefix
    /// bound is rule.rs's property, over the mixer alone).
    #[test]
    fn every_row_once_per_source_epoch(
        rows in proptest::collection::vec(proptest::collection::vec(1usize..25, 1..3), 1..4),
        slots in 1u64..4, shuffle in prop_oneof![Just(0usize), 1usize..10], batch in 1u64..5,
    ) {
        let f = fixture(&rows);
        let k = rows.len();
        let mut s = spec(k);
        s.shuffle = vec![shuffle; k];
        s.batch = Some(batch);
        s.weights = (0..k).map(|i| 1.0 + i as f64).collect();
        let cfg = config(&f, &s, None);
        for i in 0..slots {
            let l = layout(i, slots, s.even);
            let got = drain(&cfg, &mut open(&cfg, l, &MixResume::start(&cfg))).concat();
            for (j, n) in cfg.names().iter().enumerate() {
                prop_assert_eq!(per_source(&got, n), plain(&cfg, j, l, 2));
            }
        }
    }

    /// W x K -> W' x K' with shuffle: per source, what the old layout yielded plus what the new
    /// one yields is every row once per source-epoch; the new slots start the same sequence.
    #[test]
    fn elastic_resume_is_exactly_once(
        rows in proptest::collection::vec(proptest::collection::vec(1usize..25, 1..3), 1..4),
        old in 1u64..4, new in 1u64..4, shuffle in prop_oneof![Just(0usize), 1usize..10],
        cuts in proptest::collection::vec(0usize..8, 3), mode in 0u8..3,
    ) {
        let f = fixture(&rows);
        let k = rows.len();
        let mut s = spec(k);
        s.shuffle = vec![shuffle; k];
        s.mixing = [Mixing::Deterministic, Mixing::Stratified(4), Mixing::Random][mode as usize];
        let cfg = config(&f, &s, None);
        let mut seen: Vec<(String, i64)> = Vec::new();
        let mut states = Vec::new();
        for i in 0..old {
            let mut a = open(&cfg, layout(i, old, s.even), &MixResume::start(&cfg));
            for _ in 0..cuts[i as usize] {
                if let Some(it) = a.next_item().unwrap() { seen.extend(rows_of(&cfg, &it)); }
            }
            states.push(a.checkpoint(None).unwrap().to_value());
        }
        let r = MixResume::load(&cfg, states, false, true).unwrap();
        for j in 0..new {
            seen.extend(drain(&cfg, &mut open(&cfg, layout(j, new, s.even), &r)).concat());
        }
        for n in cfg.names() {
            let mut got = per_source(&seen, &n);
            got.sort_unstable();
            let total: usize = rows[cfg.index_of(&n).unwrap()].iter().sum();
            let want: Vec<i64> = (0..total as i64).flat_map(|x| [x, x]).collect();
            prop_assert_eq!(got, want, "source {}", n);
        }
    }

    /// Weights changed on resume: each source's rows continue exactly where they were, and
    /// from the resume point on each source stays within one item of its new target.
    #[test]
    fn weight_change_on_resume(
        rows in proptest::collection::vec(proptest::collection::vec(5usize..25, 1..3), 2..4),
        w2 in proptest::collection::vec(0.05f64..1.0, 3), cut in 0usize..10,
    ) {
        let f = fixture(&rows);
        let k = rows.len();
        let mut s = spec(k);
        s.policies = vec![(OnExhausted::Cycle, None); k];
        s.samples = Some(200);
        s.shuffle = vec![3; k];
        let cfg = config(&f, &s, None);
        let l = layout(0, 1, s.even);
        let mut a = open(&cfg, l, &MixResume::start(&cfg));
        let mut seen = Vec::new();
        for _ in 0..cut {
            if let Some(it) = a.next_item().unwrap() { seen.extend(rows_of(&cfg, &it)); }
        }
        let saved = a.checkpoint(None).unwrap().to_value();
        let mut s2 = s.clone();
        s2.weights = w2[..k].to_vec();
        let cfg2 = config(&f, &s2, None);
        let err = MixResume::load(&cfg2, vec![saved.clone()], false, true).unwrap_err().to_string();
        prop_assert!(err.contains("weights changed"), "{}", err);
        let r = MixResume::load(&cfg2, vec![saved], false, false).unwrap();
        let after = drain(&cfg2, &mut open(&cfg2, l, &r)).concat();
        prop_assert_eq!(seen.len() + after.len(), 200);
        let total: f64 = s2.weights.iter().sum();
        let mut counts = vec![0f64; k];
        for (t, (n, _)) in after.iter().enumerate() {
            counts[cfg2.index_of(n).unwrap()] += 1.0;
            for (i, (count, weight)) in counts.iter().zip(&s2.weights).enumerate() {
                let target = (t + 1) as f64 * weight / total;
                prop_assert!((count - target).abs() < 1.0 + 1e-6, "source {} at {}", i, t);
            }
        }
        let whole: Vec<(String, i64)> = seen.into_iter().chain(after).collect();
        for (j, n) in cfg.names().iter().enumerate() {
            let got = per_source(&whole, n);
            let want = plain(&cfg, j, l, 40);
            prop_assert_eq!(&got[..], &want[..got.len()]);
        }
    }
}

/// A source removed on resume keeps its position in the state and continues from it when it
/// comes back; a new source starts at its beginning.
#[test]
fn removed_sources_continue_when_they_come_back() {
    let f = fixture(&[vec![20], vec![15], vec![9]]);
    let mut s = spec(3);
    s.policies = vec![(OnExhausted::Cycle, None); 3];
    s.shuffle = vec![4, 0, 2];
    let ab = config(&f, &s, Some(&[0, 1]));
    let l = layout(0, 1, s.even);
    let mut x = open(&ab, l, &MixResume::start(&ab));
    let mut seen = Vec::new();
    for _ in 0..5 {
        seen.extend(rows_of(&ab, &x.next_item().unwrap().unwrap()));
    }
    let saved = x.checkpoint(None).unwrap().to_value();
    // Drop b, add c.
    let ac = config(&f, &s, Some(&[0, 2]));
    let err = MixResume::load(&ac, vec![saved.clone()], false, true)
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("source \"c\" added") && err.contains("source \"b\" removed"),
        "{err}"
    );
    let r = MixResume::load(&ac, vec![saved], false, false).unwrap();
    let mut y = open(&ac, l, &r);
    for _ in 0..4 {
        seen.extend(rows_of(&ac, &y.next_item().unwrap().unwrap()));
    }
    let saved = y.checkpoint(None).unwrap();
    assert!(saved.removed.contains_key("b"));
    // b back.
    let abc = config(&f, &s, None);
    let r = MixResume::load(&abc, vec![saved.to_value()], false, false).unwrap();
    let mut z = open(&abc, l, &r);
    for _ in 0..10 {
        seen.extend(rows_of(&abc, &z.next_item().unwrap().unwrap()));
    }
    for (j, n) in abc.names().iter().enumerate() {
        let got = per_source(&seen, n);
        assert!(!got.is_empty(), "{n}");
        assert_eq!(&got[..], &plain(&abc, j, l, 10)[..got.len()], "source {n}");
    }
}

/// stop ends right after the stop source's last row; drop takes every row of each epoch it
/// allows; cycle with max_epochs takes exactly that many epochs.
#[test]
fn exhaustion_policies_count_exactly() {
    let f = fixture(&[vec![10], vec![30], vec![7]]);
    let l = layout(0, 1, Even::Off);
    let count = |cfg: &Arc<MixConfig>| {
        let all = drain(cfg, &mut open(cfg, l, &MixResume::start(cfg))).concat();
        cfg.names()
            .iter()
            .map(|n| per_source(&all, n).len())
            .collect::<Vec<_>>()
    };
    let mut s = spec(3);
    s.policies = vec![
        (OnExhausted::Drop, Some(2)),
        (OnExhausted::Cycle, Some(1)),
        (OnExhausted::Drop, Some(3)),
    ];
    assert_eq!(count(&config(&f, &s, None)), vec![20, 30, 21]);
    s.policies[0] = (OnExhausted::Stop, None);
    s.policies[2] = (OnExhausted::Cycle, None);
    let got = count(&config(&f, &s, None));
    assert_eq!(got[0], 10, "{got:?}");
    // Equal weights: the stop source's 10 rows come with about 10 of each other source.
    assert!(
        (9..=11).contains(&got[1]) && (9..=11).contains(&got[2]),
        "{got:?}"
    );
    let all = drain(
        &config(&f, &s, None),
        &mut open(
            &config(&f, &s, None),
            l,
            &MixResume::start(&config(&f, &s, None)),
        ),
    )
    .concat();
    assert_eq!(
        all.last().unwrap().0,
        "a",
        "the mixture ends right after a's last row"
    );
}

/// 0-row and 1-row sources, weight 0, and a single source equal to a plain stream.
#[test]
fn edge_sources() {
    let f = fixture(&[vec![0], vec![1], vec![12, 5]]);
    let l = layout(0, 1, Even::Off);
    let mut s = spec(3);
    s.policies = vec![(OnExhausted::Drop, Some(1)); 3];
    let all = drain(&config(&f, &s, None), &mut {
        let c = config(&f, &s, None);
        open(&c, l, &MixResume::start(&c))
    })
    .concat();
    let cfg = config(&f, &s, None);
    assert_eq!(per_source(&all, "a").len(), 0);
    assert_eq!(per_source(&all, "b"), vec![0]);
    assert_eq!(per_source(&all, "c"), plain(&cfg, 2, l, 1));
    // Weight 0: never taken.
    s.weights = vec![1.0, 0.0, 1.0];
    let c = config(&f, &s, None);
    let all = drain(&c, &mut open(&c, l, &MixResume::start(&c))).concat();
    assert!(per_source(&all, "b").is_empty());
    // A stop source with no rows ends the mixture before it starts.
    s.policies[0] = (OnExhausted::Stop, Some(1));
    let c = config(&f, &s, None);
    assert!(open(&c, l, &MixResume::start(&c))
        .next_item()
        .unwrap()
        .is_none());
    // A single source is the plain stream, batch for batch.
    let mut one = spec(3);
    one.shuffle = vec![0, 0, 6];
    one.batch = Some(4);
    one.policies[2] = (OnExhausted::Cycle, Some(2));
    let c = config(&f, &one, Some(&[2]));
    let got = drain(&c, &mut open(&c, l, &MixResume::start(&c)));
    let want = plain(&c, 0, l, 2);
    assert_eq!(
        got.concat().into_iter().map(|x| x.1).collect::<Vec<_>>(),
        want
    );
    assert!(got
        .iter()
        .all(|b| b.len() == 4 || b.len() == want.len() % 4));
}

/// With `even`, every slot yields the same number of items, and stop ends every slot at the
/// same item; over all slots each source stays within `slots` items of its target whenever
/// every slot has yielded the same number of items.
#[test]
fn even_layouts_end_together_and_bound_globally() {
    let f = fixture(&[vec![23], vec![41], vec![17]]);
    let mut s = spec(3);
    s.even = Even::Drop;
    s.weights = vec![0.5, 0.3, 0.2];
    s.policies = vec![
        (OnExhausted::Stop, Some(1)),
        (OnExhausted::Cycle, None),
        (OnExhausted::Cycle, None),
    ];
    s.shuffle = vec![3, 3, 3];
    s.batch = Some(2);
    let cfg = config(&f, &s, None);
    let slots = 3u64;
    let outs: Vec<Vec<(String, i64)>> = (0..slots)
        .map(|i| {
            drain(
                &cfg,
                &mut open(&cfg, layout(i, slots, s.even), &MixResume::start(&cfg)),
            )
            .concat()
        })
        .collect();
    let n = outs[0].len();
    assert!(
        n > 0 && outs.iter().all(|o| o.len() == n),
        "{:?}",
        outs.iter().map(Vec::len).collect::<Vec<_>>()
    );
    for t in 1..=n {
        for (j, w) in s.weights.iter().enumerate() {
            let c = outs
                .iter()
                .map(|o| per_source(&o[..t], &name(j)).len())
                .sum::<usize>() as f64;
            assert!((c - (slots as f64 * t as f64 * w)).abs() < slots as f64);
        }
    }
}

/// States of another mixture (settings, kind of state, strict changes) are refused, naming
/// what differs; hostile mixer numbers are refused.
#[test]
fn mismatched_and_hostile_states_are_refused() {
    let f = fixture(&[vec![20], vec![15]]);
    let s = spec(2);
    let cfg = config(&f, &s, None);
    let l = layout(0, 1, s.even);
    let mut a = open(&cfg, l, &MixResume::start(&cfg));
    a.next_item().unwrap();
    let saved = a.checkpoint(None).unwrap().to_value();
    let err = |c: &MixConfig, v: serde_json::Value| {
        MixResume::load(c, vec![v], false, false)
            .unwrap_err()
            .to_string()
    };
    let mut other = s.clone();
    other.batch = Some(4);
    other.mixing = Mixing::Stratified(2);
    let e = err(&config(&f, &other, None), saved.clone());
    assert!(
        e.contains("batch_size: state has 3, mixture has 4") && e.contains("mixing"),
        "{e}"
    );
    let mut v = saved.clone();
    v["mixer"]["deficits"]["a"] = serde_json::json!(5);
    assert!(err(&cfg, v).contains("do not sum to 0"));
    let mut v = saved.clone();
    v["mixer"]["deficits"]["zz"] = serde_json::json!(0);
    assert!(err(&cfg, v).contains("names \"zz\", which is not one of its sources"));
    let mut v = saved.clone();
    v["sources"]["a"]["position"]["cursor"] = serde_json::json!(999);
    let e = err(&cfg, v);
    assert!(e.starts_with("source \"a\": invalid state"), "{e}");
    let mut v = saved.clone();
    v["sources"]["b"]["slot"]["index"] = serde_json::json!(0);
    v["sources"]["b"]["slot"]["count"] = serde_json::json!(2);
    assert!(err(&cfg, v).contains("['sources']['b'] is the state of slot"));
    let stream_state = saved["sources"]["a"].clone();
    assert!(err(&cfg, stream_state).contains("ParquetStream's"));
    let mut v = saved.clone();
    v["version"] = serde_json::json!(2);
    assert!(err(&cfg, v).contains("mixture state version 2"));
    // A source that left the mix while it still has rows.
    let mut v = saved;
    v["mixer"]["deficits"] = serde_json::json!({"a": 0});
    let r = MixResume::load(&cfg, vec![v], false, false).unwrap();
    assert!(matches!(
        MixStream::resume(cfg.clone(), l, None, &r),
        Err(Error::State(m)) if m.contains("has left the mix")
    ));
}

/// A stratified block in progress is served before exhaustion is looked at, so a state whose
/// block still takes rows of a source that has none left (its position swapped for one at the
/// end of its last epoch) is refused: served, it would read that source past `max_epochs`
/// without end.
#[test]
fn stratified_block_beyond_a_sources_rows_is_refused() {
    let f = fixture(&[vec![20], vec![15]]);
    let mut s = spec(2);
    s.mixing = Mixing::Stratified(4);
    s.policies = vec![(OnExhausted::Drop, Some(1)); 2];
    s.batch = Some(1);
    let cfg = config(&f, &s, None);
    let l = layout(0, 1, s.even);
    let mut a = open(&cfg, l, &MixResume::start(&cfg));
    a.next_item().unwrap();
    let saved = a.checkpoint(None).unwrap().to_value();
    assert!(
        saved["mixer"]["block"]["quotas"]["b"].as_u64().unwrap() > 0,
        "{saved}"
    );
    let mut done = open(&cfg, l, &MixResume::start(&cfg));
    drain(&cfg, &mut done);
    let end = done.checkpoint(None).unwrap().to_value();
    // The untouched state loads; with b's finished position it is refused.
    let r = MixResume::load(&cfg, vec![saved.clone()], false, false).unwrap();
    assert!(MixStream::resume(cfg.clone(), l, None, &r).is_ok());
    let mut v = saved;
    v["sources"]["b"]["position"] = end["sources"]["b"]["position"].clone();
    let r = MixResume::load(&cfg, vec![v], false, false).unwrap();
    match MixStream::resume(cfg.clone(), l, None, &r) {
        Err(Error::State(m)) => assert!(
            m.contains("stratified block still takes") && m.contains("\"b\""),
            "{m}"
        ),
        other => panic!("expected a StateError, got {:?}", other.map(|_| ())),
    }
}

/// A mixed batch copies each row once, from where its source holds it (a shuffled source's
/// rows are located in its buffer's retained batches, which compaction replaces and epoch ends
/// drop): every row of every mixed batch, all columns, is the next row of the source its tag
/// names in that source's own stream, and the tags are the choices of the same mixture run
/// with `combine="by_source"`. Ids differ between sources, so a row taken from another
/// source's batch shows; the shuffled source `c` is left alone at the end, and with batches of
/// one row each item is one located row.
#[test]
fn shuffled_mixed_batches_take_each_row_from_its_source() {
    use arrow_array::RecordBatch;
    use arrow_select::concat::concat_batches;
    let dir = tempfile::tempdir().unwrap();
    let sizes = [vec![61, 44], vec![50], vec![90, 37]];
    let catalogs = sizes
        .iter()
        .enumerate()
        .map(|(i, r)| {
            let d = dir.path().join(format!("src{i}"));
            std::fs::create_dir(&d).unwrap();
            let first = 10_000 * i as i64;
            let files = crate::test_util::write_shards_from(&d, r, 5, true, first);
            Arc::new(Catalog::open(&files, None).unwrap())
        })
        .collect();
    let f = Fixture {
        _dir: dir,
        catalogs,
    };
    for batch in [16, 1] {
        let mut s = spec(3);
        s.weights = vec![3.0, 2.0, 1.0];
        s.shuffle = vec![16, 0, 9];
        s.policies = vec![(OnExhausted::Cycle, Some(2)); 3];
        s.batch = Some(batch);
        let l = layout(0, 1, s.even);
        let cfg = config(&f, &s, None);
        let mut by = s.clone();
        by.combine = Combine::BySource;
        let by_cfg = config(&f, &by, None);
        let mut by_stream = open(&by_cfg, l, &MixResume::start(&by_cfg));
        let choices: Vec<String> = drain(&by_cfg, &mut by_stream)
            .concat()
            .into_iter()
            .map(|(n, _)| n)
            .collect();
        // Each source's own stream: every row, all columns.
        let own: Vec<RecordBatch> = (0..3)
            .map(|i| {
                let src = &cfg.sources[i];
                let st = Settings {
                    epochs: Some(2),
                    ..src.settings.clone()
                };
                let r = Resume::start(0);
                let mut s =
                    Stream::resume(src.catalog.clone(), &st, &src.tuning, l, 0, &r).unwrap();
                let mut parts = Vec::new();
                while let Some(b) = s.next_batch(7).unwrap() {
                    parts.push(b);
                }
                concat_batches(src.catalog.schema(), &parts).unwrap()
            })
            .collect();
        let mut a = open(&cfg, l, &MixResume::start(&cfg));
        let mut next = [0usize; 3];
        let mut tags = Vec::new();
        let mut alone = false;
        while let Some(item) = a.next_item().unwrap() {
            let MixItem::Mixed(b) = item else {
                panic!("combine=\"mixed\" gave parts")
            };
            let tag = b
                .column_by_name("source")
                .unwrap()
                .as_any()
                .downcast_ref::<Int32Array>()
                .unwrap();
            alone |= b.num_rows() == batch as usize && (0..b.num_rows()).all(|r| tag.value(r) == 2);
            for r in 0..b.num_rows() {
                let t = tag.value(r) as usize;
                tags.push(name(t));
                let want = own[t].slice(next[t], 1);
                next[t] += 1;
                for c in ["id", "tokens", "text"] {
                    assert_eq!(
                        b.column_by_name(c).unwrap().slice(r, 1).to_data(),
                        want.column_by_name(c).unwrap().to_data(),
                        "batch {batch}, item row {r}, column {c}, source {t}"
                    );
                }
            }
        }
        assert_eq!(tags, choices, "batch {batch}");
        assert_eq!(
            next.to_vec(),
            own.iter().map(RecordBatch::num_rows).collect::<Vec<_>>()
        );
        assert!(
            alone,
            "batch {batch}: the shuffled source c is never alone in a batch"
        );
    }
}
