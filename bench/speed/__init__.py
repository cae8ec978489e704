"""Speed benchmarks: where a training's time goes, and one commit's training against another's."""
