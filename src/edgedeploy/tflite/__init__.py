"""TFLite: the flatbuffer reader and the int8 and 16x8 conversions."""
