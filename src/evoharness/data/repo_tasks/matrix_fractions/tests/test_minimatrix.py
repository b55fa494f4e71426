from _strict import real  # values from the code under test must be genuine
from fractions import Fraction as F

import pytest

from minimatrix import Matrix, SingularMatrixError

A = Matrix([[2, 1], [1, 3]])


def test_construction_and_access():
    m = Matrix([[1, F(1, 2)], [0.25, -3]])
    assert real(real(m).shape) == (2, 2)
    assert real(real(m)[0, 1]) == F(1, 2) and isinstance(real(real(m)[0, 0]), F) and real(real(m)[1, 0]) == F(1, 4)
    assert real(real(m)[-1, -1]) == -3 and real(real(m).row(1)) == [F(1, 4), -3] and real(real(m).col(0)) == [1, F(1, 4)]
    with pytest.raises(IndexError):
        m[2, 0]


def test_input_copied_and_tolist_copy():
    rows = [[1, 2], [3, 4]]
    m = Matrix(rows)
    rows[0][0] = 99
    out = m.tolist()
    out[0][0] = 42
    assert real(real(m)[0, 0]) == 1


@pytest.mark.parametrize("rows", [[], [[]], [[1, 2], [3]]])
def test_bad_shapes(rows):
    with pytest.raises(ValueError):
        Matrix(rows)


@pytest.mark.parametrize("bad", [True, "1", None, 1j])
def test_bad_entries(bad):
    with pytest.raises(TypeError):
        Matrix([[1, bad]])


def test_float_is_exact():
    assert real(real(Matrix([[0.1]]))[0, 0]) == F(0.1) != F(1, 10)


def test_immutable_and_hashable():
    with pytest.raises(TypeError):
        A[0, 0] = 5
    assert hash(real(Matrix([[1, 2]]))) == hash(real(Matrix([[F(1), F(2)]])))
    assert len({real(A), real(Matrix([[2, 1], [1, 3]]))}) == 1


def test_equality():
    assert real(Matrix([[1]])) == real(Matrix([[F(1)]]))
    assert real(Matrix([[1, 0]])) != real(Matrix([[1], [0]]))
    assert (real(A) == [[2, 1], [1, 3]]) is False


def test_identity_zeros():
    assert real(real(Matrix).identity(2)) == real(Matrix([[1, 0], [0, 1]]))
    assert real(real(real(Matrix).zeros(2, 3)).shape) == (2, 3)
    with pytest.raises(ValueError):
        Matrix.identity(0)
    with pytest.raises(ValueError):
        Matrix.zeros(1, 0)


def test_add_sub_neg_scalar():
    B = Matrix([[1, 1], [1, 1]])
    assert real(A) + real(B) == real(Matrix([[3, 2], [2, 4]]))
    assert real(A) - real(B) == real(Matrix([[1, 0], [0, 2]]))
    assert -real(A) == real(Matrix([[-2, -1], [-1, -3]]))
    assert 2 * real(A) == real(A) * 2 == real(A) + real(A)
    assert real(A) * F(1, 2) == real(A) / 2 == real(Matrix([[1, F(1, 2)], [F(1, 2), F(3, 2)]]))
    with pytest.raises(ValueError):
        A + Matrix([[1, 2]])
    with pytest.raises(ZeroDivisionError):
        A / 0


def test_matmul():
    M = Matrix([[1, 2, 3], [4, 5, 6]])
    N = Matrix([[7, 8], [9, 10], [11, 12]])
    assert real(M) @ real(N) == real(Matrix([[58, 64], [139, 154]]))
    assert real((real(N) @ real(M)).shape) == (3, 3)
    with pytest.raises(ValueError):
        M @ M
    with pytest.raises(TypeError):
        M * N


def test_transpose_trace():
    M = Matrix([[1, 2, 3], [4, 5, 6]])
    assert real(real(M).transpose()) == real(real(M).T) == real(Matrix([[1, 4], [2, 5], [3, 6]]))
    assert real(real(A).trace()) == 5
    with pytest.raises(ValueError):
        M.trace()


@pytest.mark.parametrize("rows,det", [
    ([[5]], 5), ([[2, 1], [1, 3]], 5), ([[0, 1], [1, 0]], -1), ([[1, 2], [2, 4]], 0),
    ([[2, 0, 1], [1, 3, 2], [1, 1, 2]], 6), ([[F(1, 2), F(1, 3)], [F(1, 4), F(1, 5)]], F(1, 60)),
    ([[0, 0, 1], [0, 1, 0], [1, 0, 0]], -1),
])
def test_determinant(rows, det):
    assert real(real(Matrix(rows)).determinant()) == det


def test_determinant_large_hilbert():
    n = 12
    h = Matrix([[F(1, i + j + 1) for j in range(n)] for i in range(n)])
    det = h.determinant()
    # known closed form: det(H_n) = c_n^4 / c_2n with c_n = prod_{i<n} i!
    from math import factorial, prod
    c = lambda k: prod(factorial(i) for i in range(k))  # noqa: E731
    assert real(det) == F(real(c(real(n))) ** 4, real(c(2 * real(n))))


def test_determinant_non_square():
    with pytest.raises(ValueError):
        Matrix([[1, 2]]).determinant()


def test_rank_and_rref():
    M = Matrix([[1, 2, 1], [2, 4, 0], [3, 6, 1]])
    assert real(real(M).rank()) == 2
    assert real(real(M).rref()) == real(Matrix([[1, 2, 0], [0, 0, 1], [0, 0, 0]]))
    assert real(real(Matrix([[0, 0], [0, 0]])).rank()) == 0
    assert real(real(Matrix([[1, 2, 3], [4, 5, 6]])).rank()) == 2
    assert real(real(Matrix([[0, 2, 4], [1, 1, 1]])).rref()) == real(Matrix([[1, 0, -1], [0, 1, 2]]))


def test_inverse():
    inv = A.inverse()
    assert real(inv) == real(Matrix([[F(3, 5), F(-1, 5)], [F(-1, 5), F(2, 5)]]))
    assert real(A) @ real(inv) == real(real(Matrix).identity(2))
    M = Matrix([[0, 1, 2], [1, 0, 3], [4, -3, 8]])
    assert real(M) @ real(real(M).inverse()) == real(real(Matrix).identity(3))


def test_singular():
    with pytest.raises(SingularMatrixError):
        Matrix([[1, 2], [2, 4]]).inverse()
    with pytest.raises(SingularMatrixError):
        Matrix([[1, 2], [2, 4]]).solve([1, 2])
    assert issubclass(real(SingularMatrixError), ValueError)
    with pytest.raises(ValueError):
        Matrix([[1, 2]]).inverse()


def test_solve():
    M = Matrix([[2, 1, -1], [-3, -1, 2], [-2, 1, 2]])
    assert real(real(M).solve([8, -11, -3])) == [2, 3, -1]
    assert real(real(A).solve([1, 0])) == [F(3, 5), F(-1, 5)]
    with pytest.raises(ValueError):
        A.solve([1, 2, 3])


def test_power():
    fib = Matrix([[1, 1], [1, 0]])
    assert real((real(fib) ** 10)[0, 1]) == 55
    a, b = 0, 1
    for _ in range(500):
        a, b = b, a + b
    assert real((real(fib) ** 500)[0, 1]) == real(a)
    assert real(A) ** 0 == real(real(Matrix).identity(2))
    assert real(A) ** -2 == real(real(A).inverse()) @ real(real(A).inverse())
    with pytest.raises(ValueError):
        Matrix([[1, 2]]) ** 2


def test_repr():
    assert repr(real(Matrix([[1, F(1, 2)], [0, -3]]))) == "Matrix([[1, 1/2], [0, -3]])"
