"""Builds, trains (2 epochs, seeded) and saves the Keras 3 models test_optimize.py loads, under tests/data/models/keras3;
run with Keras 3 as `keras` (TF_USE_LEGACY_KERAS unset):

    cd REPO && env -u TF_USE_LEGACY_KERAS python tests/data/models/make_keras3_models.py

Trains on the bundled Speech Commands subset (examples/kws_tree/speech_commands_subset.npz) and writes
functional/sequential as .keras and .h5 with Keras 3's probabilities and accuracy on its evaluation split
(NAME_ref.npz); ops.keras has a Keras 3 operation (x / 255) in its graph, lora.keras a LoRA Dense layer,
hard_silu.keras an activation tf_keras computes with several layers (these three are not trained).
"""

from pathlib import Path

import keras
import numpy as np

L = keras.layers
HERE = Path(__file__).resolve().parent
out, data = HERE / "keras3", HERE.parents[2] / "examples" / "kws_tree" / "speech_commands_subset.npz"
out.mkdir(exist_ok=True)
keras.utils.set_random_seed(5)
d = np.load(data)
fit, ev = d["split"] == 0, d["split"] == 1

inp = keras.Input((49, 10, 1))
x = L.Conv2D(16, (10, 4), strides=2, padding="same", use_bias=False, name="stem")(inp)
x = L.BatchNormalization(name="stem_bn")(x)
x = L.ReLU(name="stem_relu")(x)
y = L.DepthwiseConv2D(3, padding="same", name="dw")(x)
y = L.Conv2D(16, 1, activation="relu6", name="pw")(y)  # tf_keras has relu6 only as a layer
x = L.Add(name="add")([x, y])
a = L.Conv2D(16, 1, activation="relu", name="branch")(x)
b = L.MaxPooling2D(3, strides=1, padding="same", name="pool")(x)
x = L.Concatenate(name="cat")([a, b])
x = L.SeparableConv2D(32, 3, padding="same", activation="relu", name="sep")(x)
x = L.Dropout(0.2, name="drop")(x)
x = L.GlobalAveragePooling2D(name="gap")(x)
functional = keras.Model(inp, L.Dense(12, activation="softmax", name="head")(x))
sequential = keras.Sequential([keras.Input((49, 10, 1)), L.Rescaling(0.05), L.Flatten(),
                               L.Dense(16, kernel_regularizer="l2"), L.BatchNormalization(), L.LeakyReLU(negative_slope=0.1),
                               L.Dense(12, activation="softmax")])
for name, model in (("functional", functional), ("sequential", sequential)):
    model.compile(optimizer="adam", loss="sparse_categorical_crossentropy")
    model.fit(d["x"][fit], d["y"][fit], epochs=2, batch_size=64, verbose=0)
    model.save(f"{out}/{name}.keras")
    model.save(f"{out}/{name}.h5")
    probs = model.predict(d["x"][ev], verbose=0)
    np.savez(f"{out}/{name}_ref.npz", probs=probs, accuracy=100 * np.mean(probs.argmax(1) == d["y"][ev]))

i = keras.Input((49, 10, 1))
keras.Model(i, L.Dense(12, name="head")(L.Flatten()(i) / 255.0)).save(f"{out}/ops.keras")
keras.Model(i, L.Dense(12, lora_rank=2, name="head")(L.Flatten()(i))).save(f"{out}/lora.keras")
keras.Model(i, L.Dense(12, activation="hard_silu", name="head")(L.Flatten()(i))).save(f"{out}/hard_silu.keras")
