module tb;
  reg [15:0] A; reg [7:0] B; wire [15:0] result, odd;
  div_16bit uut(.A(A), .B(B), .result(result), .odd(odd));
  integer i;
  initial begin
    A = 0; B = 0; #1;
    for (i = 0; i < 3000; i = i + 1) begin A = $random; B = $random; #1; end
    A = 16'hffff; B = 8'hff; #1; A = 0; B = 0; #1; A = 16'hffff; B = 1; #1; A = 16'h0; B = 8'hff; #1;
    $finish;
  end
endmodule
