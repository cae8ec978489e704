"""The course's transfer run, reproduced: torchvision's ViT-B/16 IMAGENET1K_V1, backbone frozen,
a new 3-class head, Adam 1e-3, 10 epochs, the weights' own preprocessing (the feature-extractor
recipe), over several seeds. Needs internet once (the weights, 330 MB, are cached by torchvision).

    python -m bench.accuracy.transfer --seeds 3                       # FoodVision Mini (225 / 75)
    python -m bench.accuracy.transfer --seeds 3 --data pizza_steak_sushi_20_percent

The course reported 0.918 test accuracy on FoodVision Mini (averaged per batch there; per image here).
Pass another spec after --, e.g. -- --pretrained timm:vit_base_patch16_224.augreg2_in21k_ft_in1k
"""

import sys

from bench.accuracy.recipe import main

if __name__ == "__main__":
    argv = sys.argv[1:]
    if "--recipe" not in argv:
        argv = ["--recipe", "feature-extractor", *argv]
    sys.exit(main(argv))
