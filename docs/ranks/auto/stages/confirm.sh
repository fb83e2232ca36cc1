#!/usr/bin/env bash
# Receives posted early or where torch posts them, for the plans of more stages than ranks that schedule=auto chose
# (measure.sh's `auto` plans), beside one stage per rank (`gpipe_placer`, torch's posting is early there already):
# BUILDS jobs of each, interleaved (variants.py). Output: variants_MODEL.json and confirm.log here.
set -euo pipefail
cd "$(dirname "$0")/../../../.."
S=docs/ranks/auto/stages
export OMP_NUM_THREADS=1 MKL_NUM_THREADS=1 PYTHONPATH=.
for m in ${MODELS:-text_classifier mobilenet_v2 encoder_decoder unet vgg16}; do
  python $S/variants.py $m --builds "${BUILDS:-5}" --settings jit,early > $S/variants_$m.json 2>> $S/confirm.log
done
python $S/variants.py text_classifier --plans $S/plan_text_classifier_izb.json,gpipe_placer --builds "${BUILDS:-5}" \
    --settings jit,early > $S/variants_text_classifier_izb.json 2>> $S/confirm.log
