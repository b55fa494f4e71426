"""Exact rational matrices (fractions.Fraction): arithmetic, elimination, inverse, solve, powers."""

from fractions import Fraction
from numbers import Rational

__all__ = ["Matrix", "SingularMatrixError"]


class SingularMatrixError(ValueError):
    pass


def _entry(x):
    if isinstance(x, bool) or not isinstance(x, (int, Fraction, float)):
        raise TypeError(f"matrix entries must be int, Fraction or float, not {type(x).__name__}")
    return Fraction(x)


def _is_scalar(x):
    return isinstance(x, Rational) and not isinstance(x, bool)


class Matrix:
    __slots__ = ("_rows",)

    def __init__(self, rows):
        rows = [[_entry(x) for x in row] for row in rows]
        if not rows or not rows[0] or any(len(r) != len(rows[0]) for r in rows):
            raise ValueError("a matrix needs at least one row, all rows of the same non-zero length")
        object.__setattr__(self, "_rows", tuple(tuple(r) for r in rows))

    def __setattr__(self, name, value):
        raise TypeError("Matrix is immutable")

    @classmethod
    def zeros(cls, rows, cols):
        if rows < 1 or cols < 1:
            raise ValueError("shape must be at least 1x1")
        return cls([[0] * cols for _ in range(rows)])

    @classmethod
    def identity(cls, n):
        if n < 1:
            raise ValueError("n must be >= 1")
        return cls([[int(i == j) for j in range(n)] for i in range(n)])

    @property
    def shape(self):
        return len(self._rows), len(self._rows[0])

    def __getitem__(self, index):
        i, j = index
        return self._rows[i][j]

    def row(self, i):
        return list(self._rows[i])

    def col(self, j):
        return [r[j] for r in self._rows]

    def tolist(self):
        return [list(r) for r in self._rows]

    def __eq__(self, other):
        if not isinstance(other, Matrix):
            return NotImplemented
        return self._rows == other._rows

    def __hash__(self):
        return hash(self._rows)

    def __repr__(self):
        return "Matrix([" + ", ".join("[" + ", ".join(str(x) for x in r) + "]" for r in self._rows) + "])"

    def _same_shape(self, other):
        if not isinstance(other, Matrix):
            return False
        if other.shape != self.shape:
            raise ValueError(f"shape mismatch: {self.shape} vs {other.shape}")
        return True

    def __add__(self, other):
        if not self._same_shape(other):
            return NotImplemented
        return Matrix([[a + b for a, b in zip(r, s)] for r, s in zip(self._rows, other._rows)])

    def __sub__(self, other):
        if not self._same_shape(other):
            return NotImplemented
        return Matrix([[a - b for a, b in zip(r, s)] for r, s in zip(self._rows, other._rows)])

    def __neg__(self):
        return Matrix([[-a for a in r] for r in self._rows])

    def __mul__(self, k):
        if isinstance(k, Matrix):
            raise TypeError("use @ for the matrix product")
        if not _is_scalar(k):
            return NotImplemented
        return Matrix([[a * k for a in r] for r in self._rows])

    __rmul__ = __mul__

    def __truediv__(self, k):
        if not _is_scalar(k):
            return NotImplemented
        if k == 0:
            raise ZeroDivisionError("matrix division by zero")
        return Matrix([[a / k for a in r] for r in self._rows])

    def __matmul__(self, other):
        if not isinstance(other, Matrix):
            return NotImplemented
        if self.shape[1] != other.shape[0]:
            raise ValueError(f"cannot multiply {self.shape} by {other.shape}")
        cols = list(zip(*other._rows))
        return Matrix([[sum((a * b for a, b in zip(r, c)), Fraction(0)) for c in cols] for r in self._rows])

    def transpose(self):
        return Matrix(list(zip(*self._rows)))

    T = property(transpose)

    def _square(self):
        if self.shape[0] != self.shape[1]:
            raise ValueError(f"not a square matrix: {self.shape}")

    def trace(self):
        self._square()
        return sum((self._rows[i][i] for i in range(self.shape[0])), Fraction(0))

    def _eliminate(self, augment=None):
        """Gauss-Jordan on [self | augment]; returns (rows, pivot columns, determinant sign*scale)."""
        rows = [list(r) + (list(a) if augment else []) for r, a in zip(self._rows, augment or self._rows)]
        n_rows, n_cols = self.shape
        pivots, det, r = [], Fraction(1), 0
        for c in range(n_cols):
            p = next((i for i in range(r, n_rows) if rows[i][c] != 0), None)
            if p is None:
                det = Fraction(0)
                continue
            if p != r:
                rows[r], rows[p] = rows[p], rows[r]
                det = -det
            pv = rows[r][c]
            det *= pv
            rows[r] = [x / pv for x in rows[r]]
            for i in range(n_rows):
                if i != r and rows[i][c] != 0:
                    f = rows[i][c]
                    rows[i] = [x - f * y for x, y in zip(rows[i], rows[r])]
            pivots.append(c)
            r += 1
            if r == n_rows:
                break
        if len(pivots) < n_cols:
            det = Fraction(0)
        return rows, pivots, det

    def rref(self):
        rows, _, _ = self._eliminate()
        return Matrix(rows)

    def rank(self):
        return len(self._eliminate()[1])

    def determinant(self):
        self._square()
        return self._eliminate()[2]

    def inverse(self):
        self._square()
        n = self.shape[0]
        rows, pivots, _ = self._eliminate(Matrix.identity(n)._rows)
        if len(pivots) < n:
            raise SingularMatrixError("matrix is singular")
        return Matrix([r[n:] for r in rows])

    def solve(self, b):
        self._square()
        if len(b) != self.shape[0]:
            raise ValueError("b must have one entry per row")
        rows, pivots, _ = self._eliminate([[_entry(x)] for x in b])
        if len(pivots) < self.shape[0]:
            raise SingularMatrixError("matrix is singular")
        return [r[-1] for r in rows]

    def __pow__(self, k):
        if isinstance(k, bool) or not isinstance(k, int):
            return NotImplemented
        self._square()
        base = self.inverse() if k < 0 else self
        result, k = Matrix.identity(self.shape[0]), abs(k)
        while k:
            if k & 1:
                result = result @ base
            base, k = base @ base, k >> 1
        return result
