"""The subcommands of `foodvit`, one function each: read the parsed options, call the library,
print the result. Heavy libraries (PyTorch, torchvision, matplotlib) are imported inside the
commands that need them, so that `foodvit --help`, `models` and `recipes` stay fast."""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

from foodvit.errors import FoodVitError


def cmd_train(args: argparse.Namespace) -> int:
    from foodvit.cli.options import build_config, given_overrides
    from foodvit.errors import ConfigError
    from foodvit.rundir.directory import default_out
    from foodvit.training.trainer import resume, train

    main_process = int(os.environ.get("RANK", "0")) == 0  # under torchrun, rank 0 alone speaks
    say = (lambda text: print(text, file=sys.stderr)) if main_process else (lambda text: None)

    if args.resume:
        extra = [o for o in given_overrides(args) if o != "data.source"] + (["--recipe"] if args.recipe else []) + \
            (["--model"] if args.model else [])
        if extra or args.out:
            flags = ["--" + o.split(".", 1)[1].replace("_", "-") if "." in o else o for o in extra] + (["--out"] if args.out else [])
            raise ConfigError(f"--resume continues the run exactly as configured in {args.resume}/config.json; "
                              f"drop {', '.join(flags)}, or start a new run with --out (--data may point at the run's photos moved elsewhere)")
        args.run_dir = args.resume
        say(f"run directory: {args.resume}")
        result = resume(args.resume, quiet=args.quiet, data=getattr(args, "data.source"), verbose=args.verbose,
                        timeout_s=args.dist_timeout)
    else:
        config = build_config(args.recipe or "default", args, model=args.model)
        args.run_dir = args.out or str(default_out())
        say(f"run directory: {args.run_dir}")
        result = train(config, args.run_dir, quiet=args.quiet, verbose=args.verbose, timeout_s=args.dist_timeout)
    if not main_process:
        return 0
    print(f"test accuracy {result.test['acc']:.3f} ({round(result.test['acc'] * result.test['n'])}/{result.test['n']} photos); "
          f"report: {result.run / 'report.md'}")
    return 0


def cmd_cv(args: argparse.Namespace) -> int:
    from foodvit.errors import ConfigError

    if args.compare:
        from foodvit.tuning.compare import compare_studies

        extra = [option for option, given in (("--teachers", args.teachers), ("--fold", args.fold)) if given]
        if extra:
            raise ConfigError(f"{' and '.join(extra)} {'are' if len(extra) > 1 else 'is'} for a study being run (borrowed teachers, "
                              f"chosen folds); --compare only reads two studies: leave {' and '.join(extra)} out")

        print(compare_studies(*args.compare)[1])
        return 0
    if not args.out:
        raise ConfigError("foodvit cv needs --out STUDY (a folder for the fold runs), or --compare STUDY_A STUDY_B")
    from foodvit.cli.options import build_config
    from foodvit.tuning.cv import cross_validate

    config = build_config(args.recipe or "default", args, model=args.model)
    result = cross_validate(config, args.out, folds=args.folds, seeds=args.seeds, progress=not args.quiet, teachers=args.teachers,
                            only=args.fold, jobs=args.jobs)
    for f in result.folds:
        print(f"  seed {f['seed']} fold {f['fold']}: {f['accuracy']:.3f} ({f['correct']}/{f['n']})", file=sys.stderr)
    if result.left:
        left, ran = result.left, sorted(set(args.fold))
        print(f"fold{'s' if len(ran) > 1 else ''} {', '.join(map(str, ran))} of {args.folds}{' (of each seed)' if args.seeds > 1 else ''}: "
              f"accuracy {result.accuracy:.3f} over their {result.n} photos; fold{'s' if len(left) > 1 else ''} "
              f"{', '.join(map(str, left))} still to run (--fold, or the same command without it); the study is written once every fold has run")
    else:
        print(f"{result.line()}; {Path(args.out) / 'cv.md'}")
    return 0


def cmd_tune(args: argparse.Namespace) -> int:
    _need("tune", "optuna")
    import optuna

    from foodvit.cli.options import build_config
    from foodvit.tuning.search import parse_budget, tune

    # the command prints its own line per trial, a failed one's error included (Optuna's warning adds a traceback)
    optuna.logging.set_verbosity(optuna.logging.ERROR)
    config = build_config(args.recipe or "default", args, model=args.model)
    log = (lambda text: None) if args.quiet else (lambda text: print(text, file=sys.stderr))
    print(tune(args.out, config, trials=args.trials, budget_s=parse_budget(args.budget) if args.budget else None,
               space_file=args.space, folds=args.folds, storage=args.storage, log=log))
    return 0


def cmd_evaluate(args: argparse.Namespace) -> int:
    from foodvit.deploy.inference import evaluate_split
    from foodvit.deploy.predictor import Predictor

    predictor = Predictor.open(args.run)  # a run directory, or an exported .onnx (then no PyTorch is loaded)
    split = _evaluation_source(args.run, args.data, predictor).open_split(args.split, strict=args.strict)
    for line in split.skipped_summary(args.verbose):
        print(line, file=sys.stderr)
    result = evaluate_split(predictor, split)
    if args.json:
        print(json.dumps(result))
        return 0
    correct = round(result["accuracy"] * result["n"])
    print(f"{args.split} accuracy {result['accuracy']:.4f} ({correct}/{result['n']} photos), loss {result['loss']:.4f}")
    for name, acc in result["per_class"].items():
        print(f"  {name:<20} {acc:.3f}")
    return 0


def _evaluation_source(run: str, data: str | None, predictor):
    """The photos to evaluate a model on: --data; else, for a run directory, the source stored with
    it (its class subset included); for an exported file, the first of its own data and
    $FOODVIT_DATA that is at hand (an export never starts a download)."""
    from foodvit.data.datasource import DataSource
    from foodvit.errors import DataError

    if data:
        return DataSource.parse(data)
    config = Path(run) / "config.json"
    if config.is_file():
        from foodvit.rundir.directory import read_config

        return DataSource.parse(read_config(config).data.source)
    for source in predictor.data_sources():
        if source.root_at_hand() is not None:
            return source
    raise DataError(f"the photos {Path(run).name} was trained on are not at hand here; name them with --data PATH "
                    "(a folder with test/<class>/, or a folder of class folders)")


def cmd_predict(args: argparse.Namespace) -> int:
    from foodvit.deploy.inference import predict
    from foodvit.deploy.labelling import PhotoList
    from foodvit.deploy.predictor import Predictor

    if args.out:
        from foodvit.cli.labelling import label_to_file

        return label_to_file(args)
    args.images = list(PhotoList(args.images, args.files_from))  # folders and the list file expanded: a few photos, printed at the end
    predictor = Predictor.open(args.run)  # a run directory, or an exported .onnx (then no PyTorch is loaded)
    results = predict(predictor, args.images, top_k=args.top_k)
    if args.plot:
        from foodvit.deploy.inference import plot_predictions
        from foodvit.viz.plotting import save_figure

        save_figure(plot_predictions(args.images, results), _writable(args.plot))
    failed = [r for r in results if "error" in r]
    for r in failed:
        print(f"foodvit predict: skipped {r['error']}", file=sys.stderr)
    if args.json:
        print(json.dumps(results))
    else:
        for r in results:
            if "error" in r:
                continue
            others = ", ".join(f"{label} {p:.3f}" for label, p in r["top_k"][1:])
            print(f"{r['image']}: {r['label']} ({r['probability']:.3f}){'; then ' + others if others else ''}  [{r['seconds'] * 1000:.0f} ms]")
        if args.plot:
            print(f"plot: {args.plot}")
    return 1 if failed else 0


def _writable(path: str) -> Path:
    """An output file's path, or a one-line error before any work is lost to an unwritable place."""
    from foodvit.errors import RunError

    out = Path(path)
    if out.is_dir():
        raise RunError(f"{out} is a folder; give a file name, e.g. {out / 'picture.png'}")
    folder = out.parent if str(out.parent) else Path(".")
    try:
        folder.mkdir(parents=True, exist_ok=True)
    except OSError as err:
        raise RunError(f"cannot create the folder {folder} for {out} ({err.strerror or err}); choose another path") from None
    if not os.access(folder, os.W_OK):
        raise RunError(f"cannot write to {folder} (read-only or not yours); choose another path for {out.name}")
    return out


def cmd_data(args: argparse.Namespace) -> int:
    from foodvit.data.datasource import DataSource
    from foodvit.data.folders import check, is_food101

    source = DataSource.parse(args.source)
    root = source.root()
    if args.print_path:
        print(root)
        return 0
    print(f"data: {root}" + (" (Food-101 layout)" if is_food101(root) else "") + (f", classes {', '.join(source.classes)}" if source.classes else ""))
    for split in ("train", "test"):
        if is_food101(root) or (root / split).is_dir():
            s = check(source.listing(split, root), quiet=False)
            print(f"  {split}: {len(s)} photos, {len(s.classes)} classes; " + ", ".join(f"{k} {v}" for k, v in list(s.counts().items())[:12])
                  + (" ..." if len(s.classes) > 12 else ""))
            for line in s.skipped_summary(args.verbose):
                print(f"  {line}")
    return 0


def cmd_patches(args: argparse.Namespace) -> int:
    from foodvit.data.photos import load_or_explain
    from foodvit.viz.attention import feature_maps
    from foodvit.viz.figures import add_feature_maps, patches_figure
    from foodvit.viz.plotting import save_figure

    out = _writable(args.out)
    photo = load_or_explain(Path(args.image))
    predictor = model = None
    if args.feature_maps:
        from foodvit.deploy.predictor import Predictor

        predictor = Predictor.from_run(args.feature_maps)
        model = predictor.model
    size = args.image_size or (model.config.image_size if model else 224)
    patch = args.patch_size or (model.config.patch_size if model else 16)
    fig = patches_figure(photo, size, patch, predictor.preprocess if predictor is not None else None)
    if predictor is not None:
        import torch

        x = torch.from_numpy(predictor.prepare(photo))[None]
        fig = add_feature_maps(fig, feature_maps(model, x, args.channels))
    print(save_figure(fig, out))
    return 0


def cmd_explain(args: argparse.Namespace) -> int:
    from foodvit.data.photos import load_or_explain
    from foodvit.deploy.predictor import Predictor
    from foodvit.viz.figures import explain_figure
    from foodvit.viz.plotting import save_figure

    out = _writable(args.out)
    predictor = Predictor.from_run(args.run)
    photo = load_or_explain(Path(args.image))
    print(save_figure(explain_figure(predictor, photo, args.top_k, args.heads), out))
    return 0


def cmd_inspect(args: argparse.Namespace) -> int:
    import torch

    from foodvit.data.photos import load_or_explain
    from foodvit.deploy.predictor import Predictor
    from foodvit.errors import RunError
    from foodvit.viz.attention import attention_distances_over
    from foodvit.viz.figures import attention_distance_figure, filters_figure, pos_similarity_figure
    from foodvit.viz.plotting import save_figure

    predictor = Predictor.from_run(args.run)
    model = predictor.model
    out = Path(args.out)
    if out.exists() and not out.is_dir():
        raise RunError(f"--out {out} is a file; inspect writes three pictures into a folder: choose a folder")
    _writable(str(out / "filters.png"))
    written = []
    if model.config.stem == "patch":
        written.append(save_figure(filters_figure(model), out / "filters.png"))
    else:
        print("filters.png: skipped, the model's convolutional stem has no single set of P x P filters", file=sys.stderr)
    if model.config.pos_embed == "learned":
        written.append(save_figure(pos_similarity_figure(model), out / "pos_similarity.png"))
    else:
        print(f"pos_similarity.png: skipped, the model's position embedding is {model.config.pos_embed!r}, not learned, "
              "so there is nothing learned to compare", file=sys.stderr)
    split = _evaluation_source(args.run, args.data, predictor).open_split(args.split)
    photos = split.samples[:: max(1, len(split.samples) // args.images)][: args.images]  # spread over the classes
    images = torch.stack([torch.from_numpy(predictor.prepare(load_or_explain(path), str(path))) for path, _ in photos])
    distances = attention_distances_over(model, images)
    written.append(save_figure(attention_distance_figure(distances, model.config.image_size), out / "attention_distance.png"))
    for path in written:
        print(path)
    return 0


def _need(extra: str, *modules: str) -> None:
    """A one-line error naming the extra to install when an optional library is missing."""
    import importlib.util

    missing = [m for m in modules if importlib.util.find_spec(m) is None]
    if missing:
        raise FoodVitError(f"this command needs {', '.join(missing)}, which come with the {extra} extra: "
                           f"pip install 'foodvit[{extra}]'")


def cmd_serve(args: argparse.Namespace) -> int:
    _need("serve", "fastapi", "uvicorn", "gradio", "multipart")
    from foodvit.deploy.serve import serve

    onnx = str(args.run).lower().endswith(".onnx")
    if not Path(args.run).exists():
        from foodvit.errors import RunError

        raise RunError(f"{args.run} does not exist; give a run directory written by foodvit train (or an exported Space's "
                       "model/ folder), or an .onnx file written by foodvit export")
    os.environ.setdefault("GRADIO_ANALYTICS_ENABLED", "False")  # this process serves: nothing leaves the machine
    if onnx:
        _need("onnx", "onnxruntime")  # and no PyTorch: ONNX Runtime takes --threads itself
    elif args.threads:
        import torch

        torch.set_num_threads(args.threads)
    serve(args.run, host=args.host, port=args.port, max_batch=args.max_batch, max_wait_ms=args.max_wait_ms, top_k=args.top_k,
          max_upload_mb=args.max_upload_mb, max_megapixels=args.max_megapixels, examples=not args.no_examples,
          threads=args.threads if onnx else None)
    return 0


def cmd_export_space(args: argparse.Namespace) -> int:
    if args.onnx:
        _need("export", "onnx", "onnxruntime", "onnxscript")
        import logging

        logging.getLogger().setLevel(logging.ERROR)  # ONNX Runtime's quantiser's generic advice (as cmd_export)
    from foodvit.deploy.space import export_space

    folder = export_space(args.run, args.folder, examples_per_class=args.examples, onnx=args.onnx, quantize=args.quantize)
    if args.examples and not any((Path(folder) / "examples").iterdir()):
        print("note: no example photos: the run's photos are not at hand here (set FOODVIT_DATA to a folder of them, "
              "or copy a few photos into the Space's examples/)", file=sys.stderr)
    what = " (ONNX Runtime, no PyTorch)" if args.onnx else ""
    print(f"Space ready in {folder}{what}: cd {folder} && python app.py  (offline, http://127.0.0.1:7860/); "
          "to publish, push the folder to a Hugging Face Space")
    return 0


def cmd_export(args: argparse.Namespace) -> int:
    if args.format == "onnx":
        _need("export", "onnx", "onnxruntime", "onnxscript")
    import logging

    from foodvit.deploy.export import export

    # this process exports: ONNX Runtime's quantiser logs generic advice (pre-process the model first) on the
    # root logger, which the parity line below answers better
    logging.getLogger().setLevel(logging.ERROR)

    result = export(args.run, args.out, args.format, args.quantize, args.opset, photos=args.photos or (), force=args.force,
                    with_attention=args.with_attention)
    what = args.format + (f" {args.quantize}" if args.quantize else "") + (" with attention" if args.with_attention else "")
    attention = "" if result["attention"] is None else f", attention rollout within {result['attention']:.1e}"
    print(f"{result['path']}: {what}, {result['bytes'] / 1e6:.1f} MB; parity on {result['photos']} photos: max relative logit "
          f"difference {result['parity']:.2e}, same top class on {result['agreement']:.0%}{attention}")
    if result["quantization"]:
        from foodvit.deploy.quantize import describe

        print(f"quantisation: {describe(result['quantization'])}")
    return 0


def cmd_summary(args: argparse.Namespace) -> int:
    import torch

    from foodvit.model.summary import format_summary
    from foodvit.model.variants import create_model

    with torch.device("meta"):
        model = create_model(args.model, num_classes=args.num_classes, image_size=args.image_size)
    print(format_summary(model, (args.batch_size, 3, args.image_size, args.image_size), args.depth))
    return 0


def cmd_compare(args: argparse.Namespace) -> int:
    from foodvit.rundir.compare import compare_runs

    print(compare_runs([Path(r) for r in args.runs]))
    return 0


def cmd_models(args: argparse.Namespace) -> int:
    from foodvit.model.variants import get_variant, list_models

    for name in list_models():
        v = get_variant(name)
        print(f"{name:<10} layers {v.size.depth:>2}  D {v.size.embed_dim:>4}  MLP {v.size.mlp_dim:>4}  heads {v.size.num_heads:>2}  "
              f"params {v.num_params:>13,}  ({v.size.source})")
    return 0


def cmd_recipes(args: argparse.Namespace) -> int:
    from foodvit.recipes import list_recipes, recipe_path

    for name in list_recipes():
        first = recipe_path(name).read_text().splitlines()[0].lstrip("# ").strip()
        print(f"{name:<18} {first}")
    return 0
