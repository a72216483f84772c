"""Prediction networks f of φ(x) = h'(x) · f(h(x)⁻¹ · x), one module per backbone."""
