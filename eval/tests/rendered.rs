//! The built-in models' checkers on rendered samples: each accepts what the renderer drew
//! for the prompt and rejects each wrong part.

mod image_checker {
    use flashdiff_eval::image;
    use flashdiff_models::families::tinydit::scene::*;

    #[test]
    fn parses_and_checks_rendered_scenes() {
        let p = "A red circle top left and a blue square bottom right on a white background.";
        let s = parse(p).unwrap();
        assert_eq!(s.objects.len(), 2);
        assert_eq!(COLOURS[s.background].0, "white");
        let img = render(&s);
        assert!(image::check(&img, &s).all());
        // The same image against a different scene fails.
        let other =
            parse("a red triangle top left and a blue square bottom right on a white background")
                .unwrap();
        let v = image::check(&img, &other);
        assert!(v.background && v.present && !v.shape);
        let wrong_bg =
            parse("a red circle top left and a blue square bottom right on a black background")
                .unwrap();
        assert!(!image::check(&img, &wrong_bg).background);
        for shape in 0..4 {
            let s = Scene {
                background: 7,
                texture: 0,
                objects: vec![Object {
                    colour: 3,
                    shape,
                    position: 4,
                }],
            };
            assert!(
                image::check(&render(&s), &s).all(),
                "shape {}",
                SHAPES[shape]
            );
        }
    }
}

mod video_checker {
    use flashdiff_eval::video;
    use flashdiff_models::families::tinydit::clips::*;

    const PROMPT: &str =
        "a red circle top left moving right and a blue square bottom still on a white background";

    #[test]
    fn sampled_clips_round_trip_through_their_prompts() {
        let mut failed = 0;
        for seed in 0..200 {
            let c = sample(seed);
            assert_eq!(parse(&prompt_text(&c)).unwrap(), c, "seed {seed}");
            // Two objects may cross (as in the training data): one can hide the other.
            let ok = video::check(&render(&c), &c).all();
            assert!(
                ok || c.objects.len() == 2,
                "seed {seed}: {}",
                prompt_text(&c)
            );
            failed += usize::from(!ok);
        }
        assert!(failed <= 10, "{failed} of 200 rendered clips failed");
    }

    #[test]
    fn the_checker_accepts_a_rendered_clip_and_rejects_each_wrong_part() {
        let c = parse(PROMPT).unwrap();
        assert!(video::check(&render(&c), &c).all());
        let with = |f: &dyn Fn(&mut Clip)| {
            let mut w = c.clone();
            f(&mut w);
            video::check(&render(&w), &c)
        };
        assert!(!with(&|w| w.background = 0).background);
        assert!(!with(&|w| w.objects[0].motion = 0).motion);
        assert!(!with(&|w| w.objects[1].motion = 3).motion);
        assert!(!with(&|w| w.objects[0].shape = 2).shape);
        assert!(!with(&|w| w.objects[0].position = 2).place);
        assert!(!with(&|w| w.objects[1].colour = 4).present);
        assert!(!video::check(&[0.5; 10], &c).all());
    }
}

mod sound_checker {
    use flashdiff_eval::sound;
    use flashdiff_models::families::tinydit::sounds::*;

    #[test]
    fn the_checker_hears_each_kind_and_pitch_and_the_order() {
        let ev = |k: &str, p: &str| Event {
            kind: KINDS.iter().position(|x| *x == k).unwrap(),
            pitch: PITCHES.iter().position(|x| x.0 == p).unwrap(),
        };
        for k in KINDS {
            for (p, _) in PITCHES {
                let e = ev(k, p);
                let wave = render(&[(e, 10, 30)]);
                assert!(
                    sound::check(&wave, &[e]).all(),
                    "{k} {p}: {:?}",
                    sound::check(&wave, &[e])
                );
            }
        }
        let (a, b) = (ev("beep", "high"), ev("hum", "low"));
        let wave = render(&[(a, 4, 22), (b, 36, 56)]);
        assert!(sound::check(&wave, &[a, b]).all());
        let swapped = sound::check(&wave, &[b, a]);
        assert!(!swapped.all() && swapped.count, "{swapped:?}");
        assert!(!sound::check(&wave, &[a]).count);
        assert!(!sound::check(&[0.0; 16], &[a]).all());
        assert!(!sound::check(&vec![0.0; FRAMES * HOP], &[a]).all());
    }
}
